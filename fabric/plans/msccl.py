"""Load an MSCCL-IR XML file (microsoft/msccl-tools, msccl/language/ir.py's output) into a validated Plan.

<algo name ngpus coll nchunksperloop inplace> <gpu id i_chunks o_chunks s_chunks> <tb id send recv chan>
<step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep> (ir_to_xml's old_format; the newer
<op step type buf off cnt depid deps>, buf/off the source of a send and the destination otherwise, is
read too; a reference a step does not use, written with offset -1, is ignored). Step types: s send, r recv, rrc
recv_reduce, rrs recv_reduce_send, rcs recv_copy_send, rrcs recv_reduce_copy_send, cpy copy, re
reduce, nop. A threadblock (tb) is a channel of its GPU: its steps run in order, a step waits for
(depid, deps) of the same GPU; its sends go to GPU `send`, its receives come from GPU `recv`, matched
in order per (sender, receiver, chan). The loader orders each GPU's steps into one program by running
every threadblock of every GPU until it would wait (a receive before its send, a dependency not done),
pass after pass (visiting only the threadblocks something woke: linear in their number); a file in which
no step can go on is refused (a deadlock). In-place (inplace="1"): the output is the
input (MSCCL writes o_chunks="0"). Input is bounded: at most 16 MiB, UTF-8, no DOCTYPE or entity
declarations (no entity expansion), only the elements above.
"""

import heapq
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ..errors import PlanError
from .format import GpuProgram, Op, Plan, Ref
from .validate import validate

MAX_BYTES = 16 << 20
# bounds on a file's numbers, so that a tiny file cannot make the loader or the validator take the host's
# memory (a symbolic run keeps a set per chunk of every GPU) nor a rank fail on an unpackable number
MAX_INT = 1 << 24        # any attribute: ids, steps, offsets, counts, channels
MAX_GPUS = 1024          # ngpus
MAX_CHUNK_CELLS = 1 << 20  # chunks of all buffers of all GPUs together
KIND = {"s": "send", "r": "recv", "rrc": "recv_reduce", "rrs": "recv_reduce_send", "rcs": "recv_copy_send",
        "rrcs": "recv_reduce_copy_send", "cpy": "copy", "re": "reduce", "nop": "nop"}
COLL = {"allreduce": "allreduce", "allgather": "allgather", "reduce_scatter": "reduce_scatter",
        "reducescatter": "reduce_scatter", "alltoall": "all2all", "all2all": "all2all", "broadcast": "broadcast"}
BUF = {"i": "i", "o": "o", "s": "s", "input": "i", "output": "o", "scratch": "s"}


def _int(element: ET.Element, name: str, where: str, default: int | None = None) -> int:
    value = element.get(name)
    if value is None:
        if default is not None:
            return default
        raise PlanError(f"MSCCL-IR {where}: attribute {name!r} missing")
    try:
        number = int(value)
    except ValueError:
        raise PlanError(f"MSCCL-IR {where}: attribute {name}={value!r} is not an integer") from None
    if not -1 <= number <= MAX_INT:
        raise PlanError(f"MSCCL-IR {where}: attribute {name}={value!r} is out of range (-1 to {MAX_INT})")
    return number


def _ref(step: ET.Element, which: str, where: str, sends: bool) -> Ref | None:
    buf, off = step.get(f"{which}buf"), f"{which}off"
    if buf is None and step.get("buf") is not None and (which == "src") == sends:  # the newer <op buf off>
        buf, off = step.get("buf"), "off"
    if buf is None:
        return None
    if buf not in BUF:
        raise PlanError(f"MSCCL-IR {where}: {which}buf={buf!r} unknown (i, o, s)")
    return Ref(BUF[buf], _int(step, off, where), _int(step, "cnt", where, 1))


def loads(data: bytes | str, origin: str = "<string>") -> Plan:
    """The validated Plan of MSCCL-IR XML `data` (bounds in the module docstring)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_BYTES:
        raise PlanError(f"MSCCL-IR {origin}: {len(data)} bytes, more than the {MAX_BYTES} bytes a plan may have")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"MSCCL-IR {origin}: not UTF-8 (byte {exc.start})") from None
    if re.search(rb"<!\s*(doctype|entity)", data, re.IGNORECASE):
        raise PlanError(f"MSCCL-IR {origin}: DOCTYPE and entity declarations are refused")
    try:
        algo = ET.fromstring(data)
    except ET.ParseError as exc:
        raise PlanError(f"MSCCL-IR {origin}: not well-formed XML ({exc})") from None
    if algo.tag != "algo":
        raise PlanError(f"MSCCL-IR {origin}: the root element is <{algo.tag}>, not <algo>")
    n = _int(algo, "ngpus", origin)
    if not 1 <= n <= MAX_GPUS:
        raise PlanError(f"MSCCL-IR {origin}: ngpus={n}, a plan is for 1 to {MAX_GPUS} GPUs")
    coll = algo.get("coll", "")
    if coll.lower() not in COLL:
        raise PlanError(f"MSCCL-IR {origin}: coll={coll!r} unknown; known: {', '.join(COLL)}")
    inplace = _int(algo, "inplace", origin, 0) == 1
    gpus = sorted(algo.findall("gpu"), key=lambda e: _int(e, "id", origin))
    if [_int(e, "id", origin) for e in gpus] != list(range(n)):
        raise PlanError(f"MSCCL-IR {origin}: <gpu> ids {[e.get('id') for e in gpus]}, want 0..{n - 1}")
    tbs = {}  # (gpu, tb id) -> (channel, send, recv, [steps])
    for g, e in enumerate(gpus):
        for tb in e.findall("tb"):
            where = f"{origin} GPU {g} tb {tb.get('id')}"
            steps = tb.findall("step") + tb.findall("op")  # msccl-tools' old and new formats
            steps.sort(key=lambda s: _int(s, "s" if s.tag == "step" else "step", where))
            tbs[(g, _int(tb, "id", where))] = (_int(tb, "chan", where, 0), _int(tb, "send", where, -1),
                                               _int(tb, "recv", where, -1), steps)
    ops: dict[int, list[Op]] = {g: [] for g in range(n)}
    index: dict[tuple[int, int, int], int] = {}  # (gpu, tb, step) -> its index in the GPU's program
    at = {key: 0 for key in tbs}
    posted: dict[tuple[int, int, int], int] = {}  # (sender, receiver, chan) -> messages sent so far
    taken: dict[tuple[int, int, int], int] = {}
    # the passes of a round-robin over threadblocks (each runs until it would wait), visiting only those that
    # can go on: a threadblock woken by one later in the pass runs in the next pass, by one earlier in this one
    # (what a full pass over every threadblock does, in linear rather than quadratic time in their number)
    order = list(tbs)
    # what a threadblock waits for -> the waiting threadblocks' positions
    waiting: dict[tuple[str | int, ...], list[int]] = {}
    current, following = list(range(len(order))), list[int]()
    queued, queued_next = set(current), set()

    def wake(what: tuple[str | int, ...], j: int) -> None:
        for i in waiting.pop(what, ()):
            if i > j and i not in queued:
                heapq.heappush(current, i)
                queued.add(i)
            elif i < j and i not in queued_next:
                heapq.heappush(following, i)
                queued_next.add(i)

    while current:
        while current:
            j = heapq.heappop(current)
            queued.discard(j)
            g, t = order[j]
            chan, send, recv, steps = tbs[(g, t)]
            while at[(g, t)] < len(steps):
                s = at[(g, t)]
                step, where = steps[s], f"{origin} GPU {g} tb {t} step {s}"
                kind = KIND.get(step.get("type"))  # type: ignore[arg-type]  # no type: None, not in KIND
                if kind is None:
                    raise PlanError(f"MSCCL-IR {where}: type={step.get('type')!r} unknown; known: {', '.join(KIND)}")
                deps = []
                depid, dep = _int(step, "depid", where, -1), _int(step, "deps", where, -1)
                if depid >= 0:
                    if (g, depid) not in tbs:
                        raise PlanError(f"MSCCL-IR {where}: depends on tb {depid}, which GPU {g} does not have")
                    if not 0 <= dep < len(tbs[(g, depid)][3]):
                        raise PlanError(f"MSCCL-IR {where}: depends on step {dep} of tb {depid}, which has "
                                        f"{len(tbs[(g, depid)][3])} steps (0 to {len(tbs[(g, depid)][3]) - 1})")
                    if (g, depid, dep) not in index:
                        waiting.setdefault(("step", g, depid, dep), []).append(j)
                        break
                    deps.append(index[(g, depid, dep)])
                receives = kind.startswith("recv")
                sends = kind == "send" or kind.endswith("_send")
                if receives and taken.get((recv, g, chan), 0) >= posted.get((recv, g, chan), 0):
                    waiting.setdefault(("message", recv, g, chan), []).append(j)
                    break
                if receives:
                    taken[(recv, g, chan)] = taken.get((recv, g, chan), 0) + 1
                if sends:
                    posted[(g, send, chan)] = posted.get((g, send, chan), 0) + 1
                    wake(("message", g, send, chan), j)
                src, dst = _ref(step, "src", where, sends), _ref(step, "dst", where, sends)
                if kind in ("recv", "recv_reduce", "recv_copy_send", "recv_reduce_copy_send"):
                    src = None
                elif kind in ("send", "recv_reduce_send"):
                    dst = None
                elif kind == "nop":
                    src = dst = None
                index[(g, t, s)] = len(ops[g])
                wake(("step", g, t, s), j)
                ops[g].append(Op(kind, chan, src, dst, send if sends else None, recv if receives else None,
                                 tuple(deps)))
                at[(g, t)] += 1
        current, following, queued, queued_next = following, [], queued_next, set()
    stuck = [f"GPU {g} tb {t} step {at[(g, t)]}" for (g, t) in tbs if at[(g, t)] < len(tbs[(g, t)][3])]
    if stuck:
        raise PlanError(f"MSCCL-IR {origin}: no step can go on (a deadlock): {'; '.join(stuck)}")
    programs, cells = [], 0
    for g, e in enumerate(gpus):
        where = f"{origin} GPU {g}"
        i, o = _int(e, "i_chunks", where), _int(e, "o_chunks", where)
        if inplace and o == 0:
            o = i
        programs.append(GpuProgram(g, tuple(ops[g]), i, o, _int(e, "s_chunks", where, 0)))
        cells += i + o + programs[-1].s_chunks
        if cells > MAX_CHUNK_CELLS:
            raise PlanError(f"MSCCL-IR {where}: the GPUs so far have {cells} chunks in all, more than the "
                            f"{MAX_CHUNK_CELLS} a plan may have")
    plan = Plan(algo.get("name", origin), COLL[coll.lower()], n, tuple(programs), inplace=inplace,
                meta={"source": origin, "nchunksperloop": _int(algo, "nchunksperloop", origin, 0)})
    return validate(plan)


def load(path: str | Path) -> Plan:
    """The validated Plan of the MSCCL-IR XML file at `path` (at most 16 MiB read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:  # a directory, a missing or unreadable file: refused like a bad file, no traceback
        raise PlanError(f"MSCCL-IR {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    return loads(data, str(path))
