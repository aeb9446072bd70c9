"""A classic mpi4py data-parallel training loop (plain mpi4py, nothing of nvlink-emu's in it).

Linear regression by SGD: every rank draws its own mini-batch, computes its local gradient, and the
ranks average the gradients with Allreduce(SUM) / size, so every rank applies the same update.

    mpiexec -n 4 python mpi4py_dp.py                                   # on a real MPI
    nvlink-emu run --mpi4py mpi4py_dp.py --preset dgx-h100            # on the emulated fabric
"""

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
features, batch = 16384, 512  # 16384 float32 parameters: a 64 KiB gradient per step
lr = 0.5 * batch  # the inputs have unit-norm rows, so the curvature is about 1 / batch

truth = np.random.default_rng(0).standard_normal(features).astype(np.float32)
weights = np.zeros(features, np.float32)
if rank == 0:
    weights[:] = np.random.default_rng(1).standard_normal(features).astype(np.float32) * 0.01
comm.Bcast(weights, root=0)  # every rank starts from rank 0's initialisation

rng = np.random.default_rng(100 + rank)  # each rank its own data shard
start = MPI.Wtime()
for step in range(steps):
    x = (rng.standard_normal((batch, features)) / np.sqrt(features)).astype(np.float32)
    y = x @ truth
    error = x @ weights - y
    grad = (x.T @ error / batch).astype(np.float32)
    comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
    grad /= size  # the average, not the sum: the step size must not grow with the rank count
    weights -= lr * grad
    loss = comm.allreduce(float(np.mean(error ** 2)), op=MPI.SUM) / size
    if rank == 0:
        print(f"step {step:3d}  loss {loss:.6f}", flush=True)

checksums = comm.gather(float(weights.sum()), root=0)
if rank == 0:
    same = len(set(checksums)) == 1
    print(f"{size} ranks, {steps} steps in {MPI.Wtime() - start:.2f} s wall; weights identical on every rank: {same}")
