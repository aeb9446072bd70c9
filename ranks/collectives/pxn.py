"""`pxn`: NCCL's rail-aligned All2All (PXN, "PCI x NVLink", NCCL 2.12): a block for a GPU of another node
first crosses NVLink to the GPU of the sender's node on the destination's rail, which sends it across in one
hop on that rail. Members form hier.py's Grid (else UnsupportedOperation); the schedule is
fabric.plans.registry.pxn's plan. Bytes per link and modeled time against `direct`: docs/model/cost-nodes.md
(pxn). All2Allv is not offered: a proxy would need every sender's counts to size what it forwards.
"""

import numpy as np

from nvlink_emu.fabric import plans

from . import plan
from .hier import Grid


def all2all(call, send: np.ndarray, send_offsets, send_counts, recv: np.ndarray, recv_offsets, recv_counts) -> None:
    """comm.all2all's call in all2allv form: every block of `send_counts` (and `recv_counts`) equal, packed
    in member order: fabric.plans.registry.pxn's plan on this communicator's grid."""
    grid = Grid(call, "all2all", "pxn")
    layout = tuple(tuple(row) for row in grid.rank)
    plan.execute(call, plans.build("pxn", call.n, "all2all", layout=layout), send, recv)
