"""partitions.py: two tenants on one NVLink Network fabric, each in its own partition.

Each partition runs its collectives on `gpu.partition` (an AllReduce and an AllGather whose results
hold its own members only) and puts into its members' windows. A GPU of another partition that has
learnt a window's handle (out of band: handles are plain numbers) is refused by the switch: its put
and its get raise AccessViolation and the window's bytes stay as they were; an export to a GPU of
another partition is refused too. GPU 0 prints everything; any wrong result fails the run.

    nvlink-emu run launch/examples/partitions.py --config launch/examples/partitioned.toml
"""

import numpy as np

from nvlink_emu.fabric import AccessViolation, ConfigError

COUNT = 1 << 16  # float32 elements of the AllReduce (256 KiB)
WINDOW_BYTES = 4096


def say(gpu, text=""):
    if gpu.rank == 0:
        print(text, flush=True)


def main(gpu):
    config = gpu.config
    if config.mode != "network" or len(config.partitions) < 2:
        raise ConfigError("partitions.py needs NVLink Network mode with two or more partitions; run it with "
                          "--config launch/examples/partitioned.toml")
    members = config.partitions[config.partition_of(gpu.rank)]
    say(gpu, f"{config.name}: {gpu.size} GPUs in partitions {[list(p) for p in config.partitions]}")

    # -- 1. collectives inside each partition --------------------------------------------------------
    grad = gpu.alloc(COUNT, "float32")
    grad[:] = gpu.rank + 1
    gpu.partition.allreduce(grad)  # sum over this partition's members, and no one else's
    ranks = gpu.alloc(len(members), "int64")
    gpu.partition.allgather(np.array([gpu.rank], np.int64), ranks)
    ok = bool((grad == sum(m + 1 for m in members)).all()) and ranks.tolist() == list(members)
    results = gpu.world.allgather_object((list(members), float(grad[0]), ranks.tolist(), ok))
    for part in config.partitions:
        got = results[part[0]]
        say(gpu, f"1. partition {got[0]}: AllReduce sum of (GPU + 1) = {got[1]:.0f}, AllGather of GPU indices = "
                 f"{got[2]}: {'its own members only' if all(results[m][3] for m in part) else 'WRONG'}")
    assert all(r[3] for r in results), f"a partition's collective result is wrong: {results}"

    # -- 2. windows: a put inside the partition lands ----------------------------------------------
    window = gpu.alloc(WINDOW_BYTES, "uint8")
    window[:] = 0
    handle = gpu.export(window)  # default `to`: this GPU's partition
    handles = gpu.world.allgather_object(handle)  # out of band: every GPU learns every handle
    peer = members[(members.index(gpu.rank) + 1) % len(members)]
    gpu.put(handles[peer], np.full(WINDOW_BYTES, gpu.rank + 1, np.uint8))
    gpu.world.barrier()  # fences this GPU's puts first
    writer = members[(members.index(gpu.rank) - 1) % len(members)]
    landed = bool((window == writer + 1).all())
    assert all(gpu.world.allgather_object(landed)), "a put inside a partition did not land"
    say(gpu, "2. every GPU put 4 KiB into the next member's window of its own partition: every one landed")

    # -- 3. a GPU of another partition, holding the handle, is refused ---------------------------------
    victim, intruder = config.partitions[0][0], config.partitions[1][0]
    before = gpu.world.allgather_object(window.tobytes() if gpu.rank == victim else None)[victim]
    outcomes = {}
    if gpu.rank == intruder:
        try:
            gpu.put(handles[victim], np.full(WINDOW_BYTES, 0xEE, np.uint8))
            gpu.fence()
            outcomes["put"] = "landed"
        except AccessViolation as exc:
            outcomes["put"] = f"AccessViolation: {exc}"
        try:
            gpu.get(handles[victim], np.empty(WINDOW_BYTES, np.uint8))
            outcomes["get"] = "read it"
        except AccessViolation as exc:
            outcomes["get"] = f"AccessViolation: {exc}"
    if gpu.rank == victim:
        spare = gpu.alloc(WINDOW_BYTES, "uint8")
        try:
            gpu.export(spare, to=[intruder])
            outcomes["export"] = "exported"
        except AccessViolation as exc:
            outcomes["export"] = f"AccessViolation: {exc}"
    gpu.world.barrier()
    after = gpu.world.allgather_object(window.tobytes() if gpu.rank == victim else None)[victim]
    seen = gpu.world.allgather_object(outcomes)
    put, get, export = seen[intruder]["put"], seen[intruder]["get"], seen[victim]["export"]
    say(gpu, f"3. GPU {intruder} (partition 1) puts into GPU {victim}'s window (partition 0) with its handle: {put}")
    say(gpu, f"   its get of the same window: {get}")
    say(gpu, f"   GPU {victim}'s window bytes {'unchanged' if before == after else 'OVERWRITTEN'}")
    say(gpu, f"   GPU {victim} exports a window to GPU {intruder}: {export}")
    assert put.startswith("AccessViolation") and get.startswith("AccessViolation"), (put, get)
    assert export.startswith("AccessViolation") and before == after, (export, before == after)
    say(gpu, "isolation holds; the link table counts the refusals (refused, violations) on the GPUs' ports")
