"""Trace tools: merge per-rank trace files into Chrome Trace Event JSON (Perfetto, chrome://tracing),
and sum them into the numbers `nvlink-emu report` prints and draws."""

import dataclasses
import itertools
import math
import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path

from nvlink_emu.fabric.addressing import MAX_GPUS
from nvlink_emu.fabric.counters import FIELDS
from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.reduction import dtype_itemsize
from nvlink_emu.fabric.trace import SCHEMA_VERSION, RankTrace, read_trace, trace_path

US = 1e-3  # Chrome traces count microseconds; modeled times are ns
MAX_TEXT = 4096  # characters of a name or message in a record


# -- what the tools take from a trace file, checked (the files are anybody's: a directory may be planted) ----
class BadRecord(ValueError):
    """A trace record that is not what a rank writes; the message names the field."""


def _number(value, what: str, low: float = -math.inf, above: bool = False) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < low or (above and value == low):
        bound = f" {'>' if above else '>='} {low:g}" if low > -math.inf else ""
        raise BadRecord(f"{what}: a finite number{bound}, got {value!r:.40}")
    return value


def _integer(value, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise BadRecord(f"{what}: an integer from {low} to {high}, got {value!r:.40}")
    return value


def _text(value, what: str) -> str:
    if type(value) is not str or len(value) > MAX_TEXT:
        raise BadRecord(f"{what}: a string of at most {MAX_TEXT} characters, got {type(value).__name__}")
    return value


_LINK = re.compile(r"(gpu|sw)(\d{1,5})->(gpu|sw)(\d{1,5})")


def _link(value, header: dict, what: str = "link") -> str:
    """A link name of the header's fabric: gpuG->swS, swS->gpuG or swS->swT, G a GPU, S and T switches."""
    match = _LINK.fullmatch(value) if type(value) is str else None
    switches = header.get("nodes", 1) + (header.get("spines") or 0)
    ends = ((match.group(1), int(match.group(2))), (match.group(3), int(match.group(4)))) if match else ()
    if not ends or ends[0][0] == ends[1][0] == "gpu" or not all(
            index < (header["gpus"] if kind == "gpu" else switches) for kind, index in ends):
        raise BadRecord(f"{what}: a link of this fabric ({header['gpus']} GPUs, {switches} switches: gpuG->swS, "
                        f"swS->gpuG, swS->swT), got {value!r:.40}")
    return value


def check_header(header: dict) -> None:
    """BadRecord unless `header` holds what the tools read, each in its range (bounded: a header's GPU
    count sizes the matrices and figures)."""
    if header.get("schema") != SCHEMA_VERSION:
        raise BadRecord(f"schema: {SCHEMA_VERSION}, got {header.get('schema')!r:.40}")
    gpus = _integer(header.get("gpus"), "gpus", 1, MAX_GPUS)
    nodes = _integer(header.get("nodes", 1), "nodes", 1, gpus)
    if gpus % nodes:
        raise BadRecord(f"nodes: {nodes} does not divide gpus, {gpus}")
    spines = _integer(header.get("spines") or 0, "spines", 0 if nodes == 1 else 1, 0 if nodes == 1 else gpus // nodes)
    rank = _integer(header.get("rank"), "rank", 0, gpus + nodes + spines - 1)
    role = header.get("role")
    if role != ("gpu" if rank < gpus else "switch"):
        raise BadRecord(f"role: {'gpu' if rank < gpus else 'switch'} for rank {rank} of {gpus} GPUs, got {role!r:.40}")
    if role == "gpu" and header.get("gpu") != rank:
        raise BadRecord(f"gpu: {rank} (the rank), got {header.get('gpu')!r:.40}")
    for key in ("fabric", "mode", "link", "config_hash"):
        _text(header.get(key), key)
    _number(header.get("clock_offset_s"), "clock_offset_s")
    timing = header.get("timing")
    if type(timing) is not dict:
        raise BadRecord(f"timing: a map, got {type(timing).__name__}")
    _number(timing.get("bandwidth_gbytes_per_s"), "timing bandwidth_gbytes_per_s", 0, above=True)
    _number(timing.get("link_latency_ns"), "timing link_latency_ns", 0)
    _integer(header.get("mtu_bytes"), "mtu_bytes", 1, 1 << 40)
    if role == "switch" and spines:
        _number(header.get("uplink_gbytes_per_s_per_gpu"), "uplink_gbytes_per_s_per_gpu", 0, above=True)


def _times(event: dict, keys, what: str) -> None:
    for key in keys:
        _number(event.get(key), f"{what} {key}")


def check_event(event: dict, header: dict) -> None:
    """BadRecord unless `event` holds, in its types and ranges, what the tools read of its kind."""
    kind = event["ev"]
    what = kind if type(kind) is str else "ev"
    switch = header["role"] == "switch"
    _number(event.get("wall"), f"{what} wall")
    if kind in ("tx", "rx", "busy"):
        _link(event.get("link"), header, f"{what} link")
        _integer(event.get("seq"), f"{what} seq", 0, 1 << 62)
        if kind == "busy":
            _times(event, ("m_start", "m_end"), what)
            return
        _text(event.get("kind"), f"{what} kind")
        _integer(event.get("payload"), f"{what} payload", 0, 1 << 62)
        _integer(event.get("raw"), f"{what} raw", 0, 1 << 62)
        if kind == "tx" or switch:
            _times(event, ("m_start", "m_end"), what)
        if switch:
            _integer(event.get("origin"), f"{what} origin", -1, header["gpus"] - 1)
    elif kind in ("coll_begin", "coll_end"):
        for key in ("name", "comm", "algorithm", "dtype", "op"):
            _text(event.get(key), f"{what} {key}")
        _integer(event.get("seq"), f"{what} seq", 0, 1 << 62)
        _integer(event.get("count"), f"{what} count", 0, 1 << 62)
        _number(event.get("m"), f"{what} m")
        try:
            dtype_itemsize(event["dtype"])
        except FabricError:
            raise BadRecord(f"{what} dtype: {event['dtype']!r:.40} is no dtype name") from None
    else:  # an instant (tlb, reduce, mcast, refused, error, ...): its fields go into the merged JSON as they are
        for key in ("m_start", "m"):
            if key in event:
                _number(event[key], f"{what} {key}")
        if kind == "error":
            _text(event.get("error"), "error error")
            _text(event.get("message"), "error message")
        _plain(event, what)


def _plain(value, what: str, depth: int = 0) -> None:
    """BadRecord unless `value` is JSON's kind of value (no bytes, string keys), nested at most 8 deep."""
    if depth > 8:
        raise BadRecord(f"{what}: nested more than 8 deep")
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise BadRecord(f"{what}: a map with string keys, got a key {key!r:.40}")
            _plain(item, what, depth + 1)
    elif type(value) in (list, tuple):
        for item in value:
            _plain(item, what, depth + 1)
    elif value is not None and type(value) not in (str, int, float, bool):
        raise BadRecord(f"{what}: {type(value).__name__} is not a trace value")


def check_end(end: dict, header: dict) -> None:
    """BadRecord unless the end record holds a modeled time and link counters of this fabric."""
    _number(end.get("m"), "end m")
    counters = end.get("counters")
    if type(counters) is not dict:
        raise BadRecord(f"end counters: a map of links, got {type(counters).__name__}")
    for link, row in counters.items():
        _link(link, header, "end counters")
        if type(row) is not dict:
            raise BadRecord(f"end counters {link}: a map of counts")
        for field in FIELDS:
            _integer(row.get(field), f"end counters {link} {field}", 0, 1 << 62)


_TRACE_NAME = re.compile(r"rank-(\d{5,})\.msgpack")  # trace_path's form
RUN_KEYS = (("config_hash", None), ("gpus", None), ("nodes", 1), ("spines", 0))  # the same in every file of a run


def checked_traces(traces: list[RankTrace]) -> tuple[list[RankTrace], list[str]]:
    """The traces of one run the tools can use, in the given order, and a warning per file left out (a
    name not of a trace's form rank-NNNNN.msgpack, a header that is not a run's or names another rank
    than the file's name, another run's - another config or shape than the run's -, a rank another
    file holds too), cut short, or cut at its first record that is not what a rank writes (or an end
    record that is not). The run's identity (config, shape) is the lowest-ranked switch's file's - no
    workload code runs on a switch -, or, with no switch's file, the first good file's (and said)."""
    good, warnings, ranks = [], [], set()
    for trace in traces:
        try:
            check_header(trace.header)
            named = _TRACE_NAME.fullmatch(trace.path.name)
            if named is None or trace_path(trace.path.parent, int(named.group(1))).name != trace.path.name:
                raise BadRecord("rank: the file's name is not a trace file's (rank-NNNNN.msgpack, the rank in 5 "
                                "digits or more)")
            if trace.header["rank"] != int(named.group(1)):
                raise BadRecord(f"rank: {int(named.group(1))} (the file's name), got {trace.header['rank']}")
        except BadRecord as exc:
            warnings.append(f"{trace.path.name}: left out: header {exc}")
            continue
        good.append(trace)
    switches = sorted((t for t in good if t.header["role"] == "switch"), key=lambda t: t.header["rank"])
    run = None
    if switches:
        run = {key: switches[0].header.get(key, default) for key, default in RUN_KEYS}
    elif good:
        run = {key: good[0].header.get(key, default) for key, default in RUN_KEYS}
        warnings.append(f"{good[0].path.name}: no switch's trace here: the run's config and shape are taken from "
                        f"this GPU's file (its own word)")
    kept = []
    for trace in good:
        this = {key: trace.header.get(key, default) for key, default in RUN_KEYS}
        if this != run:
            warnings.append(f"{trace.path.name}: left out: from another run (config {this['config_hash']}, "
                            f"not {run['config_hash']})")  # type: ignore[index]  # run: set, as good has traces
            continue
        if trace.header["rank"] in ranks:
            warnings.append(f"{trace.path.name}: left out: rank {trace.header['rank']} has another file here")
            continue
        ranks.add(trace.header["rank"])
        if trace.truncated:
            warnings.append(f"{trace.path.name}: truncated: {trace.problem}")
        for i, event in enumerate(trace.events):
            try:
                check_event(event, trace.header)
            except BadRecord as exc:
                warnings.append(f"{trace.path.name}: read up to event {i}: {exc}")
                trace = dataclasses.replace(trace, events=trace.events[:i], end=None, truncated=True)
                break
        if trace.end is not None:
            try:
                check_end(trace.end, trace.header)
            except BadRecord as exc:
                warnings.append(f"{trace.path.name}: its end record left out: {exc}")
                trace = dataclasses.replace(trace, end=None, truncated=True)
        kept.append(trace)
    return kept, warnings


def read_run(directory) -> tuple[list[RankTrace], list[str]]:
    """The traces of one run in `directory` that the tools can use, in rank file order, and warnings
    about the others (see checked_traces; a file with no header, or no regular file, is left out too);
    FileNotFoundError naming `directory` if none is usable."""
    paths = sorted(Path(directory).glob("rank-*.msgpack"))
    if not paths:
        raise FileNotFoundError(f"{directory}: no rank-*.msgpack trace files")
    traces, warnings = [], []
    for path in paths:
        trace = read_trace(path)
        if trace.header:
            traces.append(trace)
        else:
            warnings.append(f"{path.name}: left out: {trace.problem or 'no header'}")
    kept, more = checked_traces(traces)
    warnings += more
    if not kept:  # one line: what each file is
        raise FileNotFoundError(f"{directory}: no trace file a run wrote ({'; '.join(warnings)[:2000]})")
    return kept, warnings


def write_replacing(path, write) -> None:
    """write(file) into a new temporary file beside `path` (O_EXCL), then renamed onto `path`: never
    written through a symbolic link planted at `path` (the rename replaces the link itself), and whole
    or not at all. OSError if it cannot be written."""
    path = Path(path)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(out.fileno(), 0o666 & ~umask)  # as open() would have made it (mkstemp's is 0600)
        os.replace(partial, path)
    finally:
        if os.path.lexists(partial):
            os.unlink(partial)


def rank_label(header: dict) -> str:
    """A rank's name in traces and reports: "GPU 3", "switch (rank 8)" on one node, "leaf 1 (rank 11)"
    or "spine 0 (rank 18)" on several (the fabric's rank numbering: GPUs first, then switches)."""
    if header["role"] == "gpu":
        return f"GPU {header['rank']}"
    nodes = header.get("nodes", 1)
    if nodes == 1:
        return f"switch (rank {header['rank']})"
    switch = header["rank"] - header["gpus"]
    return f"leaf {switch} (rank {header['rank']})" if switch < nodes else f"spine {switch - nodes} (rank {header['rank']})"


def leaf_of(header: dict, gpu: int) -> int:
    """The leaf switch GPU `gpu` is attached to, from a trace header."""
    return gpu // (header["gpus"] // header.get("nodes", 1))


def packets(traces: list[RankTrace]) -> dict[tuple[str, int], dict]:
    """Every counted packet, by (link, seq): its 'tx' record (sender), 'rx' record (receiver), and the
    receiving GPU's 'busy' record (its downlink occupancy) where there is one."""
    by_key: dict[tuple[str, int], dict] = defaultdict(dict)
    for trace in traces:
        for event in trace.events:
            if event["ev"] in ("tx", "rx", "busy"):
                by_key[(event["link"], event["seq"])][event["ev"]] = {**event, "rank": trace.header["rank"]}
    return by_key


def merge(traces: list[RankTrace], time_base: str = "modeled") -> dict:
    """Chrome Trace Event JSON: a process per rank, a track per link and direction, spans for packets
    and collectives (never overlapping on one track), flow arrows from each send to its receive,
    counter tracks of cumulative payload bytes per link. time_base: "modeled" or "wall"."""
    if time_base not in ("modeled", "wall"):
        raise ValueError(f"time base must be 'modeled' or 'wall', got {time_base!r}")
    modeled = time_base == "modeled"
    ranks = {t.header["rank"]: t for t in traces}
    latency = next(iter(ranks.values())).header["timing"]["link_latency_ns"]

    def wall(rank: int, seconds: float) -> float:
        # microseconds since the barrier every rank left together (each rank's own clock)
        return (seconds - ranks[rank].header["clock_offset_s"]) * 1e6

    out: list[dict] = []
    tracks: dict[tuple[int, str], int] = {}
    spans: dict[tuple[int, int], list] = defaultdict(list)

    def track(pid: int, name: str) -> int:
        if (pid, name) not in tracks:
            tracks[(pid, name)] = len([1 for p, _ in tracks if p == pid]) + 1
        return tracks[(pid, name)]

    span_ids = itertools.count()

    def span(pid: int, name: str, label: str, start: float, end: float, args: dict) -> tuple[int, int]:
        tid = track(pid, name)
        index = next(span_ids)
        spans[(pid, tid)].append((start, max(end, start), label, args, name, index))
        return pid, index

    flow_id = 0
    flows = []
    for (link, seq), ends in sorted(packets(traces).items()):
        tx, rx = ends.get("tx"), ends.get("rx")
        if tx is None or rx is None:
            continue  # one end was not traced (tracing switched off in between)
        busy = ends.get("busy")
        args = {"kind": tx["kind"], "payload": tx["payload"], "raw": tx["raw"], "seq": seq}
        if modeled:
            if "->gpu" not in link:  # uplink or between switches: the sender books it, the receiver gets it later
                send = (tx["m_start"], tx["m_end"])
                recv = (rx["m_start"], rx["m_end"])
            else:  # downlink: the GPU measured the occupancy when it took the packet in
                send = (busy["m_start"], busy["m_end"]) if busy else (tx["m_start"], tx["m_end"])
                recv = (send[0] + latency, send[1] + latency)
            send, recv = tuple(t * US for t in send), tuple(t * US for t in recv)
        else:
            t_send, t_recv = wall(tx["rank"], tx["wall"]), wall(rx["rank"], rx["wall"])
            t_recv = max(t_recv, t_send)  # clocks of different hosts may disagree; causality may not
            send, recv = (t_send, t_recv), (t_recv, t_recv + 0.01)
        a = span(tx["rank"], f"{link} send", tx["kind"], *send, args)
        b = span(rx["rank"], f"{link} receive", tx["kind"], *recv, args)
        flow_id += 1
        flows.append((flow_id, a, b))
    sent: dict[tuple[int, str], list] = defaultdict(list)  # (rank, link) -> [(ts, payload bytes)]
    for trace in traces:
        rank = trace.header["rank"]
        begun = {}
        for event in trace.events:
            ev = event["ev"]
            if ev == "tx":
                ts = event["m_start"] * US if modeled else wall(rank, event["wall"])
                sent[(rank, event["link"])].append((ts, event["payload"]))
            elif ev == "coll_begin":
                begun[(event["comm"], event["seq"])] = event
            elif ev == "coll_end":
                first = begun.pop((event["comm"], event["seq"]), None)
                if first is None:  # no begin on this rank: nothing to span
                    continue
                start = first["m"] * US if modeled else wall(rank, first["wall"])
                end = event["m"] * US if modeled else wall(rank, event["wall"])
                span(rank, "collectives", f"{event['name']} ({event['algorithm']})", start, end,
                     {k: event[k] for k in ("comm", "seq", "count", "dtype", "op", "algorithm")})
            elif ev in ("reduce", "mcast", "tlb", "refused", "error"):
                if modeled:
                    m = event.get("m_start", event.get("m"))
                    if m is None:
                        continue  # no modeled time to place it at
                    ts = m * US
                else:
                    ts = wall(rank, event["wall"])
                out.append({"ph": "i", "s": "t", "name": ev, "pid": rank, "tid": track(rank, "switch decisions"
                            if trace.header["role"] == "switch" else "events"), "ts": ts,
                            "args": {k: v for k, v in event.items() if k not in ("ev", "wall")}})
    # counter tracks: bytes sent so far, in time order (records are written in issue order, and a
    # transfer booked ahead, as in-switch contributions are, is recorded when it is actually sent)
    for (rank, link), points in sent.items():
        total = 0
        for ts, payload in sorted(points, key=lambda point: point[0]):
            total += payload
            out.append({"ph": "C", "name": f"bytes {link}", "pid": rank, "ts": ts, "args": {"payload bytes": total}})
    # spans: lay each track's spans on lanes so none overlap, then emit them and the flows
    placed: dict[int, tuple[int, float]] = {}  # span index -> (track id it landed on, start)
    lane_tids: dict[tuple[int, str, int], int] = {}
    for (pid, tid), items in spans.items():
        lanes: list[float] = []
        for start, end, label, args, name, index in sorted(items, key=lambda x: x[0]):
            lane = next((i for i, free in enumerate(lanes) if free <= start), None)
            if lane is None:
                lanes.append(end)
                lane = len(lanes) - 1
            lanes[lane] = end
            lane_name = name if lane == 0 else f"{name} #{lane + 1}"
            key = (pid, lane_name, 0)
            if key not in lane_tids:
                lane_tids[key] = tid if lane == 0 else 1000 * lane + tid
            real_tid = lane_tids[key]
            out.append({"ph": "X", "name": label, "pid": pid, "tid": real_tid, "ts": start, "dur": end - start,
                        "args": args})
            placed[index] = (real_tid, (start + end) / 2)
    for fid, (pid_a, span_a), (pid_b, span_b) in flows:
        # flow ends sit mid-slice, so they bind to their own slice, never to a neighbour touching it
        (tid_a, ts_a), (tid_b, ts_b) = placed[span_a], placed[span_b]
        out.append({"ph": "s", "id": fid, "name": "packet", "cat": "packet", "pid": pid_a, "tid": tid_a, "ts": ts_a})
        out.append({"ph": "f", "bp": "e", "id": fid, "name": "packet", "cat": "packet", "pid": pid_b, "tid": tid_b,
                    "ts": ts_b})
    for rank, trace in ranks.items():
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": rank_label(trace.header)}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
    named = set()
    for (pid, name, _), tid in lane_tids.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        named.add((pid, tid))
    for (pid, name), tid in tracks.items():
        if (pid, tid) not in named:  # tracks with instant events only
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"time_base": time_base, "fabric": next(iter(ranks.values())).header["fabric"]}}


def link_totals(traces: list[RankTrace]) -> dict[str, dict]:
    """Per link: payload bytes, raw bytes, packets (as its GPU end counted them; a link between two
    switches, as its sender did) and busy ns."""
    totals: dict[str, dict] = {}
    for trace in traces:
        header = trace.header
        if header["role"] == "gpu":
            bandwidth = header["timing"]["bandwidth_gbytes_per_s"]
            wanted: tuple[str, ...] = ("tx", "rx")
        else:  # the leaf-spine links it sends on: the node's uplink split over the spines
            spines = header.get("spines") or 0
            if not spines:
                continue
            per_node = header["gpus"] // header["nodes"]
            bandwidth = header["uplink_gbytes_per_s_per_gpu"] * per_node / spines
            wanted = ("tx",)
        for event in trace.events:
            if event["ev"] in wanted and (header["role"] == "gpu" or "->gpu" not in event["link"]):
                row = totals.setdefault(event["link"], {**{f: 0 for f in FIELDS}, "busy_ns": 0.0})
                row["payload_bytes"] += event["payload"]
                row["raw_bytes"] += event["raw"]
                row["packets"] += -(-max(event["payload"], 1) // trace.header["mtu_bytes"])
                row["busy_ns"] += event["raw"] / bandwidth
    return totals


def collectives(traces: list[RankTrace]) -> list[dict]:
    """One row per (collective, algorithm): calls, and the sum of each call's modeled time (slowest
    member's end minus earliest member's begin), in ns. A call no member ended (it failed its call
    check, or its ranks failed) is left out."""
    calls: dict[tuple, dict] = {}
    for trace in traces:
        for event in trace.events:
            if event["ev"] in ("coll_begin", "coll_end"):
                call = calls.setdefault((event["comm"], event["seq"]), {"name": event["name"],
                                        "algorithm": event["algorithm"], "begin": float("inf"), "end": None,
                                        "bytes": event["count"] * dtype_itemsize(event["dtype"])})
                if event["ev"] == "coll_begin":
                    call["begin"] = min(call["begin"], event["m"])
                else:
                    call["end"] = max(call["end"] or 0.0, event["m"])
    rows: dict[tuple, dict] = {}
    for call in calls.values():
        if call["end"] is None:
            continue
        row = rows.setdefault((call["name"], call["algorithm"]), {"collective": call["name"],
                              "algorithm": call["algorithm"], "calls": 0, "bytes": 0, "modeled_ns": 0.0})
        row["calls"] += 1
        row["bytes"] += call["bytes"]
        row["modeled_ns"] += max(0.0, call["end"] - call["begin"])
    return sorted(rows.values(), key=lambda r: (r["collective"], r["algorithm"]))


def traffic_matrix(traces: list[RankTrace]) -> tuple[list[str], list[list[int]]]:
    """Payload bytes the switch delivered to each GPU, by where the data came from: rows GPU 0..N-1
    and 'switch' (in-switch results, loads, refusals), columns the destination GPUs."""
    gpus = next(t.header["gpus"] for t in traces)
    matrix = [[0] * gpus for _ in range(gpus + 1)]
    for trace in traces:
        if trace.header["role"] == "switch":
            for event in trace.events:
                if event["ev"] == "tx" and "->gpu" in event["link"]:  # delivered to a GPU (not passed on)
                    dest = int(event["link"].split("->gpu")[1])
                    matrix[event["origin"] if event["origin"] >= 0 else gpus][dest] += event["payload"]
    return [f"GPU {g}" for g in range(gpus)] + ["switch"], matrix


def bytes_by_algorithm(traces: list[RankTrace]) -> dict[str, dict[str, int]]:
    """Per algorithm, per link: payload bytes the GPU end counted while a collective of it ran."""
    result: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for trace in traces:
        if trace.header["role"] != "gpu":
            continue
        running = None
        for event in trace.events:
            if event["ev"] == "coll_begin":
                running = f"{event['name']}/{event['algorithm']}"
            elif event["ev"] == "coll_end":
                running = None
            elif event["ev"] in ("tx", "rx") and running is not None:
                result[running][event["link"]] += event["payload"]
    return {alg: dict(links) for alg, links in result.items()}
