"""nvlink-emu demo: what NVLink Network changes compared with classic NVLink, with real traffic.

Run by `nvlink-emu demo` once on NVLink Network (dgx-h100) and once on classic NVLink (dgx-a100).
GPU 0 prints everything; the others report to it out of band.
"""

import numpy as np

from fabric.errors import AccessViolation, OutOfMemory, UnsupportedOperation

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
    say(gpu, "Per-link counters follow (printed by the switch rank).")
