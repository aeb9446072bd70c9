"""Trace tools: merge per-rank trace files into Chrome Trace Event JSON (Perfetto, chrome://tracing),
and sum them into the numbers `nvlink-emu report` prints and draws."""

import itertools
from collections import defaultdict

from nvlink_emu.fabric.counters import FIELDS
from nvlink_emu.fabric.reduction import dtype_itemsize
from nvlink_emu.fabric.trace import RankTrace

US = 1e-3  # Chrome traces count microseconds; modeled times are ns


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
                first = begun.pop((event["comm"], event["seq"]))
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
    for fid, (pid_a, a), (pid_b, b) in flows:
        # flow ends sit mid-slice, so they bind to their own slice, never to a neighbour touching it
        (tid_a, ts_a), (tid_b, ts_b) = placed[a], placed[b]
        out.append({"ph": "s", "id": fid, "name": "packet", "cat": "packet", "pid": pid_a, "tid": tid_a, "ts": ts_a})
        out.append({"ph": "f", "bp": "e", "id": fid, "name": "packet", "cat": "packet", "pid": pid_b, "tid": tid_b,
                    "ts": ts_b})
    for rank, trace in ranks.items():
        role = trace.header["role"]
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
            wanted = ("tx", "rx")
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
