"""superpod_steps.py: the demo's part 4 workload, three timed steps on a fabric of several nodes:
an All2All of 1 MiB per GPU, an AllReduce of a 1 MiB gradient (float32 sum, algorithm auto), and
one DLRM-style training step with its compute (dlrm.py's, 1 step), each checked against numpy.

    nvlink-emu run launch/examples/superpod_steps.py --preset superpod-h100-nvlink --nodes 2 --gpus-per-node 4
    nvlink-emu run launch/examples/superpod_steps.py --nodes 2 --gpus-per-node 4 \\
        --compare superpod-a100-ib,superpod-h100-ib,superpod-h100-nvlink

GPU 0 prints a step line per step (step_ns=... step=NAME link_bytes=...), which `run --compare` and
`nvlink-emu demo` read. `-- --no-dlrm` leaves the DLRM step out (the two collectives alone).
"""

import sys

import numpy as np

import dlrm  # beside this file: a workload's own folder comes first on its path
from nvlink_emu.launch.workload import timed_step

SIZE = 1 << 20  # bytes per GPU of each collective


def main(gpu):
    n, r = gpu.size, gpu.rank
    count = SIZE // 4
    block = count // n
    send = gpu.alloc(count, "float32")
    send[:] = np.repeat(np.arange(n, dtype=np.float32) + r * n, block)  # block j: r n + j, for GPU j
    recv = gpu.alloc(count, "float32")
    with timed_step(gpu, "all2all"):
        gpu.world.all2all(send, recv)
    assert np.array_equal(recv, np.repeat(np.arange(n, dtype=np.float32) * n + r, block)), "all2all"

    grad = gpu.alloc(count, "float32")
    grad[:] = r + 1
    with timed_step(gpu, "allreduce"):
        gpu.world.allreduce(grad)
    assert (grad == n * (n + 1) / 2).all(), "allreduce"

    if "--no-dlrm" not in sys.argv[1:]:
        sys.argv[1:] = ["--steps", "1", "--name", "dlrm-step"]
        dlrm.main(gpu)
