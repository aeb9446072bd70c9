"""1-D heat diffusion with a halo exchange by one-sided MPI (MPI.Win Put + Fence), a plain mpi4py program.

Each rank owns `cells` cells of a periodic rod plus a ghost cell at each end; its array is a window
(Win.Create). Every step each rank Puts its first cell into its left neighbour's right ghost and its
last cell into its right neighbour's left ghost, Fence, and updates its cells by the explicit scheme
u += alpha (u[i-1] - 2 u[i] + u[i+1]). The total heat is summed by Accumulate into rank 0's window
(Win.Allocate). Rank 0 checks both against one process running the same scheme on the whole rod, and
prints the link bytes the Puts moved.

    python mpi4py_halo.py [CELLS] [STEPS]           (any MPI, or nvlink-emu run --mpi4py ... -- CELLS STEPS)
"""

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cells = int(sys.argv[1]) if len(sys.argv) > 1 else 16
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
alpha = 0.25
left, right = (rank - 1) % size, (rank + 1) % size


def initial(n: int) -> np.ndarray:
    """The whole rod at the start: a hot spot on a ramp."""
    x = np.linspace(0.0, 1.0, n, endpoint=False)
    return x + np.exp(-((x - 0.3) ** 2) / 0.005)


def step(u: np.ndarray) -> None:
    """One explicit step of the cells u[1:-1] from their neighbours (ghosts included), in place."""
    u[1:-1] = u[1:-1] + alpha * (u[:-2] - 2.0 * u[1:-1] + u[2:])


u = np.zeros(cells + 2)  # [left ghost, cells..., right ghost]
u[1:-1] = initial(cells * size)[rank * cells:(rank + 1) * cells]
halo = MPI.Win.Create(u, u.itemsize, MPI.INFO_NULL, comm)
before = MPI.link_counters()["tx_bytes"] if hasattr(MPI, "link_counters") else 0
for _ in range(steps):
    halo.Fence()
    halo.Put(u[1:2], left, cells + 1)  # my first cell is my left neighbour's right ghost
    halo.Put(u[cells:cells + 1], right, 0)  # my last cell is my right neighbour's left ghost
    halo.Fence()
    step(u)
halo.Fence()
put_bytes = (MPI.link_counters()["tx_bytes"] if hasattr(MPI, "link_counters") else 0) - before

total = MPI.Win.Allocate(8 if rank == 0 else 0, 8, MPI.INFO_NULL, comm)
total.Fence()
total.Accumulate(np.array([u[1:-1].sum()]), 0, 0, MPI.SUM)
total.Fence()
heat = float(np.frombuffer(total.tomemory(), np.float64)[0]) if rank == 0 else None

rod = comm.gather(u[1:-1].copy(), root=0)
put_bytes = comm.gather(put_bytes, root=0)
if rank == 0:
    reference = np.zeros(cells * size + 2)
    reference[1:-1] = initial(cells * size)
    for _ in range(steps):
        reference[0], reference[-1] = reference[-2], reference[1]  # periodic
        step(reference)
    difference = float(np.abs(np.concatenate(rod) - reference[1:-1]).max())
    heat_difference = abs(heat - reference[1:-1].sum())
    print(f"{size} ranks, {cells} cells each, {steps} steps: largest difference from one process {difference:g}, "
          f"total heat {heat:.6f} (one process {reference[1:-1].sum():.6f})")
    print(f"link bytes of the Puts per rank: {put_bytes} (2 x 8 bytes a step: {16 * steps})")
    if difference != 0.0 or heat_difference > 1e-9 * abs(heat):
        raise SystemExit(f"halo exchange differs from one process: {difference:g}, heat {heat_difference:g}")
total.Free()
halo.Free()
