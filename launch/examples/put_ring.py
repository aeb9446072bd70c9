"""put_ring.py: every GPU writes 1 MiB into the next GPU's window, then checks what it received.

    nvlink-emu run launch/examples/put_ring.py --gpus 4                      # NVLink Network
    nvlink-emu run launch/examples/put_ring.py --gpus 4 --preset dgx-a100    # classic NVLink
"""

def main(gpu):
    window = gpu.alloc(1 << 20, "uint8")
    if gpu.config.mode == "network":
        target = gpu.export(window)             # a window the switch translates (Link TLB)
    else:
        target = gpu.physical_address(window)   # classic: one shared physical address space
    targets = gpu.world.allgather_object(target)  # out-of-band exchange, like real programs' sockets
    data = gpu.alloc(1 << 20, "uint8")
    data[:] = gpu.rank
    gpu.put(targets[(gpu.rank + 1) % gpu.size], data)
    gpu.world.barrier()                          # fences this GPU's puts first
    assert (window == (gpu.rank - 1) % gpu.size).all()
