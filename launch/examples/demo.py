"""nvlink-emu demo: what NVLink Network changes compared with classic NVLink, with real traffic.

Run by `nvlink-emu demo` once on NVLink Network (dgx-h100) and once on classic NVLink (dgx-a100).
GPU 0 prints everything; the others report to it out of band.
"""

import numpy as np

from nvlink_emu.fabric import AccessViolation, OutOfMemory, UnsupportedOperation

KiB = 1024


def say(gpu, text=""):
    if gpu.rank == 0:
        print(text, flush=True)


def main(gpu):
    network = gpu.config.mode == "network"
    owner, reader, stray = 1, 0, min(2, gpu.size - 1)
    window = gpu.alloc(4 * KiB, "float32")
    window[:] = 0

    # -- 1. a window reached through the fabric ---------------------------------------------------
    if network:
        say(gpu, "1. GPU 1 exports a 16 KiB window at run time to GPU 0 only; the fabric manager maps it in "
                 "the Link TLB.")
        handle = gpu.export(window, to=[reader]) if gpu.rank == owner else None
        handle = gpu.world.allgather_object(handle)[owner]
        say(gpu, f"   handle = network address {handle.network_address:#x}, window address "
                 f"{handle.address:#x}, {handle.size_bytes} bytes. GPU network addresses: "
                 f"{[hex(a) for a in gpu.world.allgather_object(gpu.network_address)]}")
    else:
        say(gpu, "1. GPU 1 publishes the physical address of a 16 KiB buffer: classic NVLink has one shared "
                 "physical address space.")
        handle = gpu.world.allgather_object(gpu.physical_address(window) if gpu.rank == owner else None)[owner]
        say(gpu, f"   physical address {handle:#x} (GPU index in the high bits, offset below)")
    if gpu.rank == reader:
        gpu.put(handle, np.arange(4 * KiB, dtype=np.float32))
        gpu.fence()
    gpu.world.barrier()
    total = gpu.world.allgather_object(float(window.sum()) if gpu.rank == owner else None)[owner]
    say(gpu, f"   GPU 0 put 16 KiB; GPU 1's window now sums to {total:.0f} (expected "
             f"{np.arange(4 * KiB).sum()}). The switch {'translated' if network else 'forwarded'} it.")

    # -- 2. a stray write from a GPU outside the allowed set ----------------------------------------
    if stray != owner and stray != reader:
        whom = "is not in the allowed set" if network else "was never given access"
        say(gpu, f"2. GPU {stray} {whom} and writes 16 KiB of 7s into the same buffer.")
        before = gpu.world.allgather_object(window.tobytes() if gpu.rank == owner else None)[owner]
        outcome = None
        if gpu.rank == stray:
            try:
                gpu.put(handle, np.full(4 * KiB, 7, np.float32))
                gpu.fence()
                outcome = "landed"
            except AccessViolation as exc:
                outcome = f"refused: AccessViolation: {exc}"
        gpu.world.barrier()
        outcome = gpu.world.allgather_object(outcome)[stray]
        after = gpu.world.allgather_object(window.tobytes() if gpu.rank == owner else None)[owner]
        say(gpu, f"   {outcome}")
        say(gpu, f"   GPU 1's window bytes {'unchanged' if before == after else 'OVERWRITTEN'} "
                 f"({'isolation holds' if before == after else 'no isolation on classic NVLink'}).")

    # -- 3. connections at run time vs at boot ------------------------------------------------------
    say(gpu, "3. Connections:")
    if network:
        if gpu.rank == owner:
            gpu.revoke(handle)
        gpu.world.barrier()
        outcome = None
        if gpu.rank == reader:
            try:
                gpu.put(handle, np.ones(16, np.float32))
                gpu.fence()
                outcome = "still landed (unexpected)"
            except AccessViolation as exc:
                outcome = f"refused after revoke: {exc}"
        say(gpu, f"   GPU 1 revoked the window at run time; GPU 0's next put is {outcome}")
    else:
        try:
            gpu.export(window)
        except UnsupportedOperation as exc:
            say(gpu, f"   export(): UnsupportedOperation: {exc}")
    gpu.world.barrier()

    # -- 4. VRAM is not merged ------------------------------------------------------------------------
    request = gpu.config.memory_capacity_bytes * 3 // 2
    free_total = sum(gpu.world.allgather_object(gpu.free_bytes))
    say(gpu, f"4. GPU 0 allocates {request / 2**20:.0f} MiB; the {gpu.size} GPUs have {free_total / 2**20:.0f} "
             f"MiB free in sum.")
    if gpu.rank == 0:
        try:
            gpu.alloc(request, "uint8")
            say(gpu, "   it fit (unexpected)")
        except OutOfMemory as exc:
            say(gpu, f"   OutOfMemory: {exc}")
    gpu.world.barrier()

    allreduce_side_by_side(gpu)
    embedding_exchange(gpu)
    say(gpu, "Per-link counters of the whole run follow on standard error (printed by the switch rank).")


def allreduce_side_by_side(gpu, nbytes=4 << 20):
    """One gradient AllReduce (avg) with each algorithm on the same data; per-GPU link bytes."""
    n = gpu.size
    say(gpu, f"5. AllReduce (avg) of a {nbytes >> 20} MiB float32 gradient on every GPU, per algorithm "
             f"(per-GPU link payload; ring/direct move 2(N-1)/N x S = {2 * (n - 1) * nbytes // n} B each way):")
    say(gpu, f"   {'algorithm':<10}{'tx B/GPU':>12}{'rx B/GPU':>12}{'x S':>7}{'modeled us':>12}{'busbw GB/s':>12}   result")
    grad = gpu.alloc(nbytes // 4, "float32")
    mine = (np.arange(grad.size) % 97 + gpu.rank).astype(np.float32)
    expected = sum((np.arange(grad.size) % 97 + r) for r in range(n)).astype(np.float32) / np.float32(n)
    for algorithm in ("ring", "direct", "sharp", "nvls"):
        grad[:] = mine
        gpu.world.barrier()  # start together, in modeled time too
        before, start = gpu.link_counters(), gpu.now_ns
        try:
            gpu.world.allreduce(grad, op="avg", algorithm=algorithm)
        except UnsupportedOperation as exc:
            say(gpu, f"   {algorithm:<10}{'-':>12}{'-':>12}{'-':>7}{'-':>12}{'-':>12}   UnsupportedOperation: "
                     f"{str(exc).rsplit(': ', 1)[-1]}")  # the reason, without who and what
            continue
        after = gpu.link_counters()
        modeled_ns = max(gpu.world.allgather_object(gpu.now_ns - start))
        busbw = nbytes / modeled_ns * 2 * (n - 1) / n
        tx, rx = after["tx_bytes"] - before["tx_bytes"], after["rx_bytes"] - before["rx_bytes"]
        ok = all(gpu.world.allgather_object(bool(np.allclose(grad, expected))))
        say(gpu, f"   {algorithm:<10}{tx:>12}{rx:>12}{tx / nbytes:>7.3f}{modeled_ns / 1e3:>12.2f}{busbw:>12.1f}   "
                 f"{'every GPU holds the average' if ok else 'WRONG'}")
    gpu.free(grad)


def embedding_exchange(gpu, rows=4096, dim=64, batch=512):
    """A recommender step's All2All: embedding rows are sharded by row % N; each GPU's batch looks
    up rows it may not own, so indices go to their owners and vectors come back (uneven blocks)."""
    n, r = gpu.size, gpu.rank
    table = np.random.default_rng(1).standard_normal((rows, dim)).astype(np.float32)  # the whole model
    shard = table[r::n].copy()  # what this GPU holds: rows r, r + N, ...
    wanted = np.random.default_rng(100 + r).integers(0, rows, batch)
    by_owner = [wanted[wanted % n == g] for g in range(n)]
    send_counts = [len(ix) for ix in by_owner]
    everyone = gpu.world.allgather_object(send_counts)  # counts travel out of band, as in real code
    recv_counts = [everyone[i][r] for i in range(n)]
    asked = np.empty(sum(recv_counts), np.int64)
    gpu.world.barrier()
    before, start = gpu.link_counters(), gpu.now_ns
    gpu.world.all2allv(np.concatenate(by_owner), send_counts, asked, recv_counts)     # indices to owners
    vectors = shard[asked // n]
    got = np.empty((batch, dim), np.float32)
    gpu.world.all2allv(vectors.reshape(-1), [c * dim for c in recv_counts], got.reshape(-1),
                       [c * dim for c in send_counts])                                  # rows back
    after = gpu.link_counters()
    modeled_ns = max(gpu.world.allgather_object(gpu.now_ns - start))
    ok = all(gpu.world.allgather_object(bool(np.array_equal(got, table[np.concatenate(by_owner)]))))
    moved = gpu.world.allgather_object(after["tx_bytes"] - before["tx_bytes"])
    say(gpu, f"6. Embedding exchange (All2Allv, as in a DLRM step): {rows} x {dim} table sharded over {n} GPUs, "
             f"{batch} lookups per GPU.")
    say(gpu, f"   lookups sent per owner by GPU 0: {send_counts}; bytes sent per GPU: {moved}; "
             f"modeled {modeled_ns / 1e3:.2f} us on {gpu.config.link}; "
             f"{'every GPU got exactly the rows it asked for' if ok else 'WRONG ROWS'}")
