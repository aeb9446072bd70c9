"""hostile_gpu.py: GPU 0 attacks the fabric while the GPUs of the other partitions work and check.

GPU 0 sends a stream of bad traffic: random bytes, mutated copies of valid packets (flipped bits,
swapped addresses, other GPUs' request numbers, group ids and keys, wrong lengths, truncated and
missing payloads), headers and payloads of sizes around every limit the switch checks (one byte
under, at, one byte over; at a GPU's header limit with the fields a switch re-encodes longer: src 0,
integer times), switch-only kinds, packets sent straight to other GPUs' MPI ranks instead of the
switch, and poisoned control messages (a pickle that would run code). The other GPUs of its
partition, if any, are its accomplices: they only take its traffic in (sized headers to one on
another node cross a spine) and check nothing.
Meanwhile the other GPUs run collectives, puts, gets and messages in their partition and check
every result, and that their private and read-only memory never changed. The run prints the
figures; any wrong byte, any refusal of a victim, or a switch that stopped serving fails it.

    nvlink-emu run launch/examples/hostile_gpu.py --config launch/examples/hostile.toml -- --packets 100000
"""

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np

from nvlink_emu.fabric.addressing import assign_network_addresses
from nvlink_emu.fabric import ConfigError, FabricTimeout
from nvlink_emu.fabric.packets import (MAX_GPU_HEADER_BYTES, MAX_HEADER_BYTES, MAX_KEY_PARTS, MAX_LIST, MAX_TEXT,
                                       ExportInfo, Kind, Packet)
from nvlink_emu.ranks.transport.packets import INLINE_FRAME_BYTES, INLINE_PAYLOAD_BYTES

ATTACKER = 0
PATTERN = 0xA5          # the bytes of every victim's private buffer
WINDOW_BYTES = 4096
ALGORITHMS = ("ring", "direct", "sharp", "nvls", "auto")


def main(gpu):
    parser = argparse.ArgumentParser(prog="hostile_gpu.py")
    parser.add_argument("--packets", type=int, default=10_000, help="packets GPU 0 sends (default 10000)")
    parser.add_argument("--seed", type=int, default=1, help="the attack's random seed")
    parser.add_argument("--rounds", type=int, default=0,
                        help="victims' checked rounds (default: as many as the attack lasts, at least 3)")
    args = parser.parse_args(sys.argv[1:])
    return run(gpu, args.packets, args.seed, args.rounds)


def run(gpu, packets: int, seed: int = 1, rounds: int = 0) -> dict:
    """The whole experiment on every GPU; returns the figures (every GPU gets the same dict)."""
    config = gpu.config
    crew = config.partitions[config.partition_of(ATTACKER)]  # the attacker and its accomplices
    victims = [g for g in range(config.gpus) if g not in crew]
    if config.mode != "network" or not victims or \
            any(len(p) < 2 for p in config.partitions if ATTACKER not in p):
        raise ConfigError("hostile_gpu.py needs NVLink Network mode with GPU 0's partition and others of at "
                          "least two GPUs each (e.g. launch/examples/hostile.toml)")
    mine = None
    if gpu.rank not in crew:
        private = gpu.alloc(WINDOW_BYTES, "uint8")
        private[:] = PATTERN
        window = gpu.alloc(WINDOW_BYTES, "uint8")
        readonly = gpu.alloc(WINDOW_BYTES, "uint8")
        readonly[:] = gpu.rank
        mine = {"window": gpu.export(window), "readonly": gpu.export(readonly, writable=False),
                "private_offset": int(private.__array_interface__["data"][0] - gpu.memory.__array_interface__["data"][0])}
    # handles are no secret: knowing one gives no access the Link TLB does not grant
    published = gpu.world.allgather_object(mine)
    start = time.monotonic()
    if gpu.rank == ATTACKER:
        stats = Attacker(gpu, published, seed).attack(packets)
    elif gpu.rank in crew:  # an accomplice: what the attacker sends it lands in its mailbox, unread
        stats = {}
    else:
        stats = defend(gpu, published, window, readonly, private, rounds, packets)
    stats["wall_s"] = round(time.monotonic() - start, 3)
    everyone = gpu.world.allgather_object(stats)
    figures = {"attacker": everyone[ATTACKER], "victims": [everyone[g] for g in victims]}
    if gpu.rank == ATTACKER:
        a = figures["attacker"]
        rounds_done = [v["rounds"] for v in figures["victims"]]
        wrong = sum(v["wrong"] for v in figures["victims"])
        print(f"hostile GPU {ATTACKER}: {a['sent']} packets sent in {a['wall_s']} s ({a['to_switch']} to the switch, "
              f"{a['straight']} straight to victims' ranks, {a['control']} poisoned control messages), "
              f"{a['refusals']} refusals came back; victims: {len(rounds_done)} GPUs, rounds {rounds_done}, "
              f"wrong bytes {wrong}", flush=True)
    return figures


# -- the victims ------------------------------------------------------------------------------------
def defend(gpu, published, window, readonly, private, rounds: int, packets: int) -> dict:
    """Work in this partition, checking every result, for `rounds` rounds (0: while the attack is
    expected to last, at least 3); returns rounds done and wrong bytes seen."""
    comm = gpu.partition
    n, r = comm.size, comm.rank
    peer = comm.members[(r + 1) % n]
    source = comm.members[(r - 1) % n]
    wrong = done = 0
    deadline = time.monotonic() + packets / 3000  # about how long the attack takes here (2 cores)
    more = True
    while more:
        algorithm = ALGORITHMS[done % len(ALGORITHMS)]
        # an AllReduce: sum over members of (GPU index + round)
        x = np.full(1000 + done, gpu.rank + done, np.int64)
        comm.allreduce(x, "sum", algorithm)
        wrong += int(np.count_nonzero(x != sum(m + done for m in comm.members)))
        # a put into the next member's window; my window then holds what the member before wrote
        data = gpu.alloc(WINDOW_BYTES, "uint8")
        data[:] = (gpu.rank * 7 + done) % 251
        gpu.put(published[peer]["window"], data)
        comm.barrier()
        wrong += int(np.count_nonzero(window != (source * 7 + done) % 251))
        gpu.free(data)
        # a get of the next member's read-only window
        got = gpu.alloc(WINDOW_BYTES, "uint8")
        gpu.get(published[peer]["readonly"], got)
        wrong += int(np.count_nonzero(got != peer))
        gpu.free(got)
        # an All2All: block i from member i is (i, my rank, round)
        send = np.array([[r, i, done] for i in range(n)], np.int64).reshape(-1)
        recv = np.empty_like(send)
        comm.all2all(send, recv)
        wrong += int(np.count_nonzero(recv != np.array([[i, r, done] for i in range(n)], np.int64).reshape(-1)))
        # a message to the next member
        gpu.send_message(peer, ("hostile-test", done), np.full(64, gpu.rank, np.int32))
        box = np.empty(64, np.int32)
        gpu.receive_message(("hostile-test", done), box, source)
        wrong += int(np.count_nonzero(box != source))
        done += 1
        # the members agree on whether to go on (their clocks differ)
        more = any(comm.allgather_object(done < rounds if rounds else (done < 3 or time.monotonic() < deadline)))
    wrong += int(np.count_nonzero(private != PATTERN)) + int(np.count_nonzero(readonly != gpu.rank))
    return {"rounds": done, "wrong": wrong}


# -- the attacker -----------------------------------------------------------------------------------
class Attacker:
    """Builds and sends the bad traffic; everything it needs to know is public."""

    def __init__(self, gpu, published, seed: int):
        self.gpu = gpu
        self.rng = np.random.default_rng(seed)
        config = gpu.config
        self.addresses = assign_network_addresses(config.gpus)  # deterministic: anyone can compute them
        crew = config.partitions[config.partition_of(ATTACKER)]
        self.victims = [g for g in range(config.gpus) if g not in crew]
        # whom a header the switches may take goes to: an accomplice (one on another node: through a spine)
        self.accomplices = [g for g in crew if g != ATTACKER] or [ATTACKER]
        self.switch = config.gpus
        handles = [h for entry in published if entry for h in (entry["window"], entry["readonly"])]
        # values that make a forgery plausible: real addresses, windows, offsets, request numbers, groups
        self.interesting = [*self.addresses, *(h.address for h in handles), *(e["private_offset"] for e in published if e),
                            0, 1, 2, 3, 7, 64, 255, 256, 4096, -1, 2 ** 31, 2 ** 40, 2 ** 63 - 1, 2 ** 64 - 1,
                            float("nan"), float("inf"), -0.5, "x", "partition1", None, True, [], [1, 2], {}]
        self.names = [f"partition{p}" for p in range(len(config.partitions))] + ["world"]
        self.templates = self._templates(handles)
        self.sent = {"to_switch": 0, "straight": 0, "control": 0, "sized": 0}
        self.owed_payloads = 0  # headers sent with a payload left out: pay them at the end, to realign

    def _key(self) -> list:
        return [str(self.rng.choice(self.names)), int(self.rng.integers(0, 40)), *map(int, self.rng.integers(0, 6, 3))]

    def _templates(self, handles) -> list[tuple[list, int]]:
        """Valid-looking headers (as wire field lists) and their payload sizes."""
        me = self.addresses[ATTACKER]
        out = []
        for h in handles:
            out += [([Kind.PUT, me, h.network_address, h.address, 256, 1, None, 0.0, 0.0], 256),
                    ([Kind.GET, me, h.network_address, h.address, 256, 2, None, 0.0, 0.0], 0)]
        for victim in self.victims:
            na = self.addresses[victim]
            out += [([Kind.GET_DATA, me, na, 0, 256, 1, None, 0.0, 0.0], 256),
                    ([Kind.PUT_ACK, me, na, 0, 0, 1, None, 0.0, 0.0], 0),
                    ([Kind.MSG, me, na, 0, 64, 0, [["hostile-test", 0]], 0.0, 0.0], 64),
                    ([Kind.MCAST, -1, na, 0, 64, 0, [1, ["partition1", 0, 0, 0]], 0.0, 0.0], 64)]
        for group in range(1, 7):
            out += [([Kind.REDUCE, me, -1, 0, 64, 0, [group, [0, 0], "sum", "int64", self.victims,
                                                      ["partition1", 0, 0, 0]], 0.0, 0.0], 64),
                    ([Kind.MCAST, me, -1, 0, 64, 0, [group, ["partition1", 0, 0, 0]], 0.0, 0.0], 64),
                    ([Kind.LOAD_REDUCE, me, -1, 0, 64, 0, [group, [0, 0], "sum", "int64", [ATTACKER],
                                                           ["partition1", 0, 4, 0], ["partition1", 0, "nvls-bound"]],
                      0.0, 0.0], 0),
                    ([Kind.GROUP, me, -1, 0, 0, 3, ["bind", group, [], ""], 0.0, 0.0], 0),
                    ([Kind.GROUP, me, -1, 0, 0, 3, ["release", group, [], ""], 0.0, 0.0], 0)]
        out += [([Kind.GROUP, me, -1, 0, 0, 4, ["create", 0, [ATTACKER, *self.victims], "partition1"], 0.0, 0.0], 0),
                ([Kind.EXPORT, me, -1, 0, 0, 5, [0, 2 ** 40, list(self.victims), True, True], 0.0, 0.0], 0),
                ([Kind.EXPORT, me, -1, 0, 0, 5, [0, 4096, [], True, True], 0.0, 0.0], 0),
                ([Kind.COUNTERS, me, -1, 0, 0, 0, [{}, [], 0.0, [], 0], 0.0, 0.0], 0),
                ([Kind.NACK, me, self.addresses[1], 0, 0, 1, ["AccessViolation", "forged", "PUT"], 0.0, 0.0], 0),
                ([Kind.SHUTDOWN, me, self.addresses[1], 0, 0, 0, {"links": {}}, 0.0, 0.0], 0),
                ([Kind.LOAD, me, self.addresses[1], 0, 64, 0, [1, [0, 0], "sum", "int64", [1], ["partition1", 0],
                                                               ["partition1", 0, "nvls-bound"]], 0.0, 0.0], 0)]
        for h in handles:
            out.append(([Kind.REVOKE, me, -1, 0, 0, 6, [h.network_address, h.address], 0.0, 0.0], 0))
        return out

    def _mutate(self, fields: list) -> list:
        """One to three random changes to a header's fields (or to its record's fields)."""
        fields = [list(f) if isinstance(f, list) else f for f in fields]
        for _ in range(int(self.rng.integers(1, 4))):
            index = int(self.rng.integers(0, len(fields)))
            value = self.interesting[int(self.rng.integers(0, len(self.interesting)))]
            if isinstance(fields[index], list) and fields[index] and self.rng.random() < 0.7:
                inner = fields[index]
                where = int(self.rng.integers(0, len(inner)))
                inner[where] = self._key() if isinstance(inner[where], list) and self.rng.random() < 0.5 else value
            elif index == 0 and self.rng.random() < 0.5:
                fields[0] = int(self.rng.choice(list(Kind)))
            else:
                fields[index] = value
        return fields

    def _header(self) -> tuple[bytes, int]:
        """Header bytes and the payload size it claims."""
        fields, size = self.templates[int(self.rng.integers(0, len(self.templates)))]
        choice = self.rng.random()
        if choice < 0.15:  # random bytes
            return self.rng.bytes(int(self.rng.integers(0, 64))), 0
        fields = self._mutate(fields) if choice < 0.8 else list(fields)
        try:
            data = msgpack.packb(fields, use_bin_type=True)
        except (OverflowError, TypeError, ValueError):
            data = msgpack.packb([int(Kind.PUT), 0, 0, 0, 0, 0, None, 0.0, 0.0])
        if self.rng.random() < 0.1:  # flip a bit of the encoded header
            at = int(self.rng.integers(0, len(data)))
            data = data[:at] + bytes([data[at] ^ (1 << int(self.rng.integers(0, 8)))]) + data[at + 1:]
        try:
            size = Packet.from_wire(data).payload_bytes
        except Exception:  # noqa: BLE001 - undecodable: whatever it claims
            pass
        return data, size

    # message sizes around every limit the switch checks (ranks/switch/, ranks/transport/packets.py, fabric.packets):
    # a GPU's header, a switch's, the message a switch drops unread (an inline frame's prefix and payload
    # beyond the limit), one byte under, at and over
    LIMITS = tuple(limit + d for limit in (MAX_GPU_HEADER_BYTES, MAX_HEADER_BYTES) for d in (-1, 0, 1))
    UNREAD = tuple(MAX_HEADER_BYTES + INLINE_FRAME_BYTES + d for d in (-1, 0, 1))

    def _sized(self) -> tuple[bytes, np.ndarray | None, bool]:
        """(header bytes, payload, inline) of a size around a limit: a MSG padded to a header of exactly a
        LIMITS size, src 0 and integer times (what a switch re-encodes longer), to an accomplice; junk of
        an UNREAD size; or a MSG at a field's limit (a key of MAX_KEY_PARTS parts or one more, a part of
        MAX_TEXT characters or one more) or an inline payload of INLINE_PAYLOAD_BYTES, one less or more;
        a REDUCE whose result list has MAX_LIST entries or one more."""
        roll = self.rng.random()
        dst = self.addresses[int(self.rng.choice(self.accomplices))]
        if roll < 0.6:
            size = int(self.rng.choice(self.LIMITS))
            payload = np.full(64, 0xEE, np.uint8)
            return _padded_msg(dst, size, payload.nbytes), payload, bool(self.rng.random() < 0.5)
        if roll < 0.7:
            return self.rng.bytes(int(self.rng.choice(self.UNREAD))), None, False
        d = int(self.rng.integers(-1, 2))
        if roll < 0.8:
            key = ["x" * (MAX_TEXT + d)] if self.rng.random() < 0.5 else ["k"] * (MAX_KEY_PARTS + d)
            header = msgpack.packb([int(Kind.MSG), 0, dst, 0, 64, 0, [key], 0, 0], use_bin_type=True)
            return header, np.full(64, 0xEE, np.uint8), True
        if roll < 0.9:
            nbytes = INLINE_PAYLOAD_BYTES + d
            header = msgpack.packb([int(Kind.MSG), 0, dst, 0, nbytes, 0, [["inline"]], 0, 0], use_bin_type=True)
            return header, np.full(nbytes, 0xEE, np.uint8), True
        dest = [1] * (MAX_LIST + d)
        header = msgpack.packb([int(Kind.REDUCE), 0, -1, 0, 64, 0, [1, [0, 0], "sum", "int64", dest,
                                                                    ["partition1", 0, 0, 0]], 0, 0], use_bin_type=True)
        return header, np.full(64, 0xEE, np.uint8), True

    def _payload(self, size: int) -> np.ndarray | None:
        """The payload to send after a header claiming `size` bytes: mostly right, sometimes short,
        long or missing (owed)."""
        if not size and self.rng.random() < 0.97:
            return None
        roll = self.rng.random()
        if roll < 0.05 or size > 1 << 20:  # missing: realigned at the end
            self.owed_payloads += 1
            return None
        if roll < 0.15:
            size = max(0, size + int(self.rng.integers(-64, 65)))
        return np.full(min(size, 4096), 0xEE, np.uint8)  # small: a payload nobody takes still completes (eager)

    def _poison(self) -> bytes:
        """A control message for a victim: code-running pickles, malformed tuples, garbage."""
        roll = self.rng.random()
        if roll < 0.4:
            return pickle.dumps(_Exploit())
        if roll < 0.7:
            return pickle.dumps(("partition1", int(self.rng.integers(0, 40)), ("barrier", 1e30)))
        if roll < 0.85:
            return pickle.dumps([1, 2, 3])
        return self.rng.bytes(int(self.rng.integers(1, 64)))

    def attack(self, packets: int) -> dict:
        gpu, raw = self.gpu, self.gpu.raw_port()
        transport, control = raw.transport, raw.control_channel
        for i in range(packets):
            roll = self.rng.random()
            if roll < 0.05:
                control.send_bytes(int(self.rng.choice(self.victims)), self._poison())
                self.sent["control"] += 1
            elif roll > 0.97:
                header, payload, inline = self._sized()
                transport.send_bytes(self.switch, header, payload, inline=inline)
                self.sent["sized"] += 1
            else:
                header, size = self._header()
                payload = self._payload(size)
                straight = roll < 0.2
                dest = int(self.rng.choice(self.victims)) if straight else self.switch
                transport.send_bytes(dest, header, payload)
                self.sent["straight" if straight else "to_switch"] += 1
            # keep the queues short: what is in flight is bounded, and refusals are taken in as they come
            while transport.in_flight > 32 or not control.idle and control.in_flight > 32:
                gpu.poll()
            if i % 16 == 0:  # take in the refusals that came back (a GPU that does not is not read from)
                for _ in range(256):
                    if not gpu.poll():
                        break
        for _ in range(self.owed_payloads):  # realign my payload stream so that my last packets are not held back
            transport.payload_only(self.switch, np.zeros(1, np.uint8))
        # A last, valid request: the switch serves my packets in order, so once its reply is here every
        # refusal of the attack is here too.
        last = gpu.alloc(64, "uint8")
        req = 2 ** 62 + 1  # a number the attack never used: only this request's reply can carry it
        transport.send(self.switch, Packet(Kind.EXPORT, self.addresses[ATTACKER], -1, req=req,
                                           info=ExportInfo(raw.offset_of(last), 64, None, True, True)))
        deadline = time.monotonic() + 2 * gpu.timeout_s
        while req not in raw.replies or not (transport.idle and control.idle):
            if time.monotonic() > deadline:
                raise FabricTimeout(f"GPU {ATTACKER}: the switch did not answer after the attack")
            gpu.poll()
        assert "handle" in raw.replies.pop(req).info, "the switch no longer serves valid requests"
        raw.replies.clear()  # replies to the attack's own control calls
        refusals = len(raw.take_refusals()) + len(raw.put_errors)
        raw.put_errors.clear()
        return {**self.sent, "sent": sum(self.sent.values()), "refusals": refusals, "owed": self.owed_payloads}


def _padded_msg(dst: int, size: int, nbytes: int) -> bytes:
    """A MSG header to `dst` of exactly `size` bytes (from 40 to ~190 KiB) as a GPU may encode it: src 0,
    integer times, its key padded (parts of MAX_TEXT characters at most, 3-byte ones first, then one of
    ASCII that takes up the rest)."""
    parts: list[str] = []

    def packed() -> bytes:
        return msgpack.packb([int(Kind.MSG), 0, dst, 0, nbytes, 0, [parts], 0, 0], use_bin_type=True)

    while size - len(packed()) > MAX_TEXT and len(parts) < MAX_KEY_PARTS - 1:
        parts.append("\u20ac" * min(MAX_TEXT, (size - len(packed()) - MAX_TEXT // 2) // 3))
    parts.append("")
    for _ in range(4):  # a string's own length prefix grows with it: settle in a few steps
        parts[-1] = "x" * max(0, min(MAX_TEXT, len(parts[-1]) + size - len(packed())))
    data = packed()
    assert len(data) == size, f"no MSG header of {size} bytes ({len(data)})"
    return data


class _Exploit:
    """Unpickling this would write a file: a victim must never run it."""

    path = str(Path(tempfile.gettempdir()) / "nvlink-emu-pwned")

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('pwned')",))
