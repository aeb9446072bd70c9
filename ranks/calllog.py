"""A GPU's record of its collective calls for the run's report, and the COUNTERS answer that carries it."""

import msgpack

from nvlink_emu.fabric.packets import MAX_GPU_HEADER_BYTES, MAX_LIST, CallRecord, CountersInfo, Kind, Packet

from .transport.packets import MAX_HEADER_BYTES

# Call records travel in the COUNTERS header, which the switch takes up to MAX_HEADER_BYTES: a GPU keeps
# its first calls' records up to this many encoded bytes (about 700 calls) and only counts the rest.
CALL_RECORD_BYTES = MAX_HEADER_BYTES * 3 // 4


class CallLog:
    """The calls recorded (`records`, oldest first), their encoded bytes, and the calls only counted."""

    def __init__(self):
        self.records: list[CallRecord] = []
        self.nbytes = 0
        self.unrecorded = 0  # calls past CALL_RECORD_BYTES

    def record(self, call: CallRecord) -> None:
        """Keep a call's record; past CALL_RECORD_BYTES of records (or MAX_LIST records), only count it."""
        size = len(msgpack.packb(call.to_wire()))
        if self.unrecorded or self.nbytes + size > CALL_RECORD_BYTES or len(self.records) >= MAX_LIST:
            self.unrecorded += 1
        else:
            self.records.append(call)
            self.nbytes += size

    def counters_packet(self, src: int, links: dict, leftovers: list, now_ns: float) -> Packet:
        """The COUNTERS answer of the GPU at routing key `src`; its call records cut (the cut ones counted),
        then its leftover message keys (a last entry ["...", n] counts the n cut), until its lists have at most
        MAX_LIST entries and the header fits in the MAX_GPU_HEADER_BYTES the switch takes from a GPU, so many
        leftover messages or calls cannot make it refused."""
        calls, keys = self.records, leftovers[:MAX_LIST - 1] if len(leftovers) > MAX_LIST else leftovers
        while True:
            shown = keys if len(keys) == len(leftovers) else [*keys, ["...", len(leftovers) - len(keys)]]
            info = CountersInfo(links, shown, float(now_ns), tuple(calls), self.unrecorded + len(self.records) - len(calls))
            packet = Packet(Kind.COUNTERS, src, -1, info=info)
            if len(packet.to_wire()) <= MAX_GPU_HEADER_BYTES:
                return packet
            if calls:
                calls = calls[:len(calls) * 3 // 4]
            elif keys:
                keys = keys[:len(keys) * 3 // 4]
            else:
                return packet
