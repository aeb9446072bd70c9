"""`hier_nvls`: hier.py with its node stages in the leaf switch (NCCL's NVLS_TREE on H100 clusters: the
leaf load-reduces and multicasts the node's columns, one ring per rail across nodes), allowed only where
the leaves reduce (fabric.hier_plan.in_leaf: superpod-h100-ib, superpod-h100-nvlink). One node or one
member a node: exactly what `hier` runs there (the node ring alone, the rail ring alone). Schedule, per-GPU
link bytes and combine order: docs/model/algorithms-hier.md ("Node stages in the leaf"); this module adds no code
of its own, so the two forms cannot drift apart."""

import numpy as np

from . import hier


def allreduce(call, array: np.ndarray) -> None:
    hier.allreduce(call, array, form="nvls")


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    hier.reduce_scatter(call, send, recv, form="nvls")


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    hier.allgather(call, send, recv, form="nvls")


def broadcast(call, array: np.ndarray, root: int) -> None:
    hier.broadcast(call, array, root, form="nvls")
