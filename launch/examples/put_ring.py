"""put_ring.py: every GPU writes 1 MiB into the next GPU's window, then checks what it received.

    nvlink-emu run launch/examples/put_ring.py --gpus 4
"""

def main(gpu):
    window = gpu.alloc(1 << 20, "uint8")
    handles = gpu.world.allgather_object(gpu.export(window))    # out-of-band handle exchange
    data = gpu.alloc(1 << 20, "uint8")
    data[:] = gpu.rank
    gpu.put(handles[(gpu.rank + 1) % gpu.size], data)
    gpu.world.barrier()                                          # fences this GPU's puts first
    assert (window == (gpu.rank - 1) % gpu.size).all()
