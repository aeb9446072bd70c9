"""Collective algorithms as data: a typed plan, its validator, its timing on the replay's link clocks,
an MSCCL-IR loader and the registry of plan-built algorithms (docs/design/plans.md)."""

from .format import BUFFERS, COLLECTIVES, IN_SWITCH, KINDS, GpuProgram, Op, Plan
from .msccl import load, loads
from .registry import ALGORITHMS, build
from .timing import plan_link_bytes, plan_ns, plan_rounds, plan_traffic
from .validate import validate

__all__ = ["BUFFERS", "COLLECTIVES", "IN_SWITCH", "KINDS", "GpuProgram", "Op", "Plan", "ALGORITHMS", "build",
           "load", "loads", "plan_link_bytes", "plan_ns", "plan_rounds", "plan_traffic", "validate"]
