"""The switch rank: executes a leaf's (fabric.switch.SwitchLogic) or a spine's (SpineLogic) decisions over MPI.

`rank`: SwitchRank, its intake, flow control and end of run; `queues`: its limits per GPU and a GPU's waiting
packets; `credits`: credits between leaves; `tracing`: its records (Records) and the GPUs' words about them; `report`:
its share of the run's report.
"""

from .rank import SwitchRank

__all__ = ["SwitchRank"]
