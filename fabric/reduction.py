"""Reduction ops, dtypes, block partitioning, and the fixed combine orders every algorithm documents.

Determinism: every reduction combines contributions in a fixed order that depends only on the
algorithm and the member ranks, never on arrival order, so results are bitwise identical run to run
and equal the numpy reference computed in the same order (`reduce_in_order`).
"""

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from .errors import FabricError

try:  # bfloat16 for numpy, from the ml_dtypes package
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    BFLOAT16 = None

OPS = ("sum", "avg", "max", "min", "prod")
# Reductions (allreduce, reduce_scatter, reduce; GPU algorithms and the switch alike) take these:
# every integer width (sum and prod wrap in the dtype, avg floors), and the float widths. bool and
# complex are refused (see check_dtype). NCCL reduces the same set but int16/uint16; NVSwitch's
# multimem reductions a smaller one (32/64-bit integers, fp16, bf16, fp32, fp64: PTX ISA,
# multimem.ld_reduce), so an 8- or 16-bit integer in-switch reduction is a what-if.
DTYPES = {name: np.dtype(name) for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                                            "uint64", "float16", "float32", "float64")}
if BFLOAT16 is not None:
    DTYPES["bfloat16"] = BFLOAT16
_COMBINE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
_REFUSED = {"b": "bool has no sum or average (reduce uint8 with max for a logical or, min for a logical and)",
            "c": "complex has no order for max and min (reduce its real view, x.view(float32 or float64), "
                 "for sum and avg)"}
_SIMPLE_NAME = re.compile(r"[<>|=]?[A-Za-z][A-Za-z0-9]*(\[[A-Za-z0-9]+\])?")  # 'uint16', '>f4', 'datetime64[ns]'
MAX_DTYPE_NAME = 200  # characters of a dtype's name in call records and fingerprints


def check_dtype(dtype: npt.DTypeLike) -> np.dtype:
    """The numpy dtype of a reduction dtype (a dtype, or one of DTYPES' names: a name is looked up,
    never parsed, as the switch takes names from GPUs it does not trust); FabricError otherwise."""
    supported = (f"reductions support {', '.join(DTYPES)}; data-movement collectives (allgather, broadcast, "
                 f"gather, scatter, all2all, all2allv, send/recv) take any fixed-size dtype")
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise FabricError(f"dtype {dtype[:MAX_DTYPE_NAME]!r}: {supported}")
        return DTYPES[dtype]
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise FabricError(f"dtype {dtype!r:.{MAX_DTYPE_NAME}}: {supported}") from None
    if dtype not in DTYPES.values():
        why = _REFUSED.get(dtype.kind)
        raise FabricError(f"dtype {dtype}: {why + '; ' if why else ''}{supported}")
    return dtype


def check_movable(dtype: npt.DTypeLike) -> np.dtype:
    """The numpy dtype of data that collectives move as bytes: any fixed-size binary layout (no
    Python objects, not empty); FabricError otherwise."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise FabricError(f"dtype {dtype!r:.{MAX_DTYPE_NAME}}: not a numpy dtype") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise FabricError(f"dtype {dtype}: collectives move fixed-size binary elements; this one has "
                          f"{'Python objects' if dtype.hasobject else 'no bytes'}")
    return dtype


def check_op(op: str) -> str:
    if op not in OPS:
        raise FabricError(f"op {op!r}: supported ops are {', '.join(OPS)}")
    return op


def dtype_name(dtype: np.dtype) -> str:
    """A name for any dtype, for call records and fingerprints: DTYPES' name for a reduction dtype,
    numpy's for another simple one ('bool', 'complex64', '>f4', '|S7'); a structured or sub-array
    dtype is 'V<itemsize>:' and its description (a digest of it past MAX_DTYPE_NAME characters), so
    dtype_itemsize can read every name back."""
    dtype = np.dtype(dtype)
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    name = str(dtype)
    if dtype.fields is None and dtype.subdtype is None and _SIMPLE_NAME.fullmatch(name):
        return name
    prefix = f"V{dtype.itemsize}:"
    if len(prefix) + len(name) > MAX_DTYPE_NAME:
        name = hashlib.sha256(name.encode()).hexdigest()[:32]
    return prefix + name


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a dtype named by dtype_name; FabricError for any other string (the names
    come from call records, which GPUs write)."""
    if name in DTYPES:
        return DTYPES[name].itemsize
    sized = re.fullmatch(r"V(\d{1,12}):.*", name, re.S) if isinstance(name, str) else None
    if sized:
        return int(sized.group(1))
    if isinstance(name, str) and _SIMPLE_NAME.fullmatch(name):
        try:
            dtype = np.dtype(name)
        except TypeError:
            pass
        else:
            if not dtype.hasobject:
                return dtype.itemsize
    raise FabricError(f"dtype name {str(name)[:MAX_DTYPE_NAME]!r}: not one dtype_name gives")


def switch_accumulator(dtype: np.dtype) -> np.dtype:
    """What the switch accumulates in: float16 and bfloat16 in float32 (NVSwitch sums 16-bit floats
    wider and rounds once at the end); every other dtype in itself."""
    return np.dtype(np.float32) if dtype in (np.dtype(np.float16), BFLOAT16) else dtype


def combine(op: str, acc: np.ndarray, x: np.ndarray) -> None:
    """acc <- acc (op) x, in place, in acc's dtype (integers wrap, like the hardware)."""
    with np.errstate(over="ignore", invalid="ignore"):
        _COMBINE[op](acc, x, out=acc)


def combine_incoming_first(op: str, acc: np.ndarray, x: np.ndarray) -> None:
    """acc <- x (op) acc, in place: combine with the operands the other way round (a chain that folds its
    own data into the partial it received, x being the partial; a plan's Op.incoming_first)."""
    with np.errstate(over="ignore", invalid="ignore"):
        _COMBINE[op](x, acc, out=acc)


def finish(op: str, acc: np.ndarray, members: int, out: np.ndarray) -> None:
    """out <- the final value of acc: avg divides the sum by the member count (floor for integers)."""
    if op == "avg":
        if acc.dtype.kind in "iu":
            acc = acc // members
        else:
            acc = acc / np.asarray(members, acc.dtype)
    out[...] = acc.astype(out.dtype, copy=False)


def reduce_in_order(arrays: Iterable[np.ndarray], op: str, accumulate: np.dtype | None = None,
                    out_dtype: npt.DTypeLike | None = None) -> np.ndarray:
    """The reference: fold `arrays` left to right with `op` in `accumulate` dtype, then finish (avg)."""
    arrays = list(arrays)
    out_dtype = np.dtype(out_dtype or arrays[0].dtype)
    acc = arrays[0].astype(accumulate or out_dtype, copy=True)
    for x in arrays[1:]:
        combine(op, acc, x.astype(acc.dtype, copy=False))
    out = np.empty(acc.shape, out_dtype)
    finish(op, acc, len(arrays), out)
    return out


def blocks(count: int, parts: int) -> list[tuple[int, int]]:
    """(start, stop) element ranges splitting `count` into `parts` blocks: the first count % parts
    blocks get one element more, so any count works, including 0 and counts smaller than parts."""
    base, extra = divmod(count, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def two_level_blocks(count: int, nodes: int, per_node: int) -> list[list[tuple[int, int]]]:
    """ranges[a][j] (element ranges): block a of blocks(|part j|, nodes) inside part j =
    blocks(count, per_node)[j], so each position j's data is one contiguous part (hier's allreduce)."""
    out = [[(0, 0)] * per_node for _ in range(nodes)]
    for j, (lo, hi) in enumerate(blocks(count, per_node)):
        for a, (x, y) in enumerate(blocks(hi - lo, nodes)):
            out[a][j] = (lo + x, lo + y)
    return out


def rail_ranges(count: int, members: int, channels: int) -> list[list[tuple[int, int]]]:
    """ranges[m][c] (element ranges): block c of blocks(|block m|, channels) inside block m =
    blocks(count, members)[m]: member m's range of channel c (ring's channels across nodes)."""
    out = []
    for lo, hi in blocks(count, members):
        out.append([(lo + x, lo + y) for x, y in blocks(hi - lo, channels)])
    return out


# a grid of members: grid[a][j] is the member at node a, position j (fabric.plans.registry.grid)
Grid = Sequence[Sequence[int]]
# one of tree's two trees: position (node, position) -> (its parent, its children in fold order)
TreePart = dict[tuple[int, int], tuple[tuple[int, int] | None, list[tuple[int, int]]]]

# A ring channel per this many bytes of the call, at most one per rail: NCCL drops channels while
# nBytes < nc x nt x threadThreshold (src/enqueue.cc), nt = 512 threads (NCCL_SIMPLE_MAX_NTHREADS,
# src/include/device.h) and threadThreshold = NCCL_SIMPLE_THREAD_THRESHOLD = 64 (src/include/comm.h)
RING_CHANNEL_BYTES = 512 * 64


def ring_channel_count(nbytes: int, rails: int) -> int:
    """Channels `ring` runs across nodes for a call of `nbytes` on `rails` positions per node:
    nbytes // RING_CHANNEL_BYTES, at least 1 (below 64 KiB the one node-major ring) and at most rails."""
    return max(1, min(rails, nbytes // RING_CHANNEL_BYTES))


def channel_rings(grid: Grid) -> list[list[int]]:
    """The rails' rings of `grid` (grid[a][j]: the member at node a, position j; N nodes x G): ring c
    visits positions c, c+1, ..., c+G-1 (mod G) of node 0, then of node 1, ..., so it enters every
    node at position c and leaves it from position c-1 (ring's channels across nodes, NCCL's rings)."""
    G = len(grid[0])
    return [[row[(c + i) % G] for row in grid for i in range(G)] for c in range(G)]


# tree's messages: NCCL's Simple-protocol step for a tree, its buffer (DEFAULT_BUFFSIZE 4 MiB,
# NVIDIA/nccl src/init.cc) over NCCL_STEPS = 8 (src/include/device.h), one step a chunk (chunkSteps is
# 1 for every algorithm but ring, src/enqueue.cc); at most the config's chunk_bytes
TREE_CHUNK_BYTES = (4 << 20) // 8


def tree_chunk(chunk_bytes: int, itemsize: int) -> int:
    """Elements per message of `tree`: min(chunk_bytes, TREE_CHUNK_BYTES) in whole elements, at least 1."""
    return max(1, min(chunk_bytes, TREE_CHUNK_BYTES) // itemsize)


def btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """(parent, child 0, child 1) of `rank` in NCCL's binary tree over ranks 0..nranks-1, rooted at 0
    (-1: none), as ncclGetBtree computes them (NVIDIA/nccl src/graph/trees.cc)."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if nranks > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= nranks:  # trees.cc's loop, as written there
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, down0, down1


def dtree(nranks: int, rank: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """`rank`'s (parent, child 0, child 1) in each of NCCL's two trees (ncclGetDtree, trees.cc): tree 0
    is btree; tree 1 is its mirror (rank -> nranks-1-rank) for an even count, shifted by one rank for
    an odd count, so that a rank that is a leaf in one tree is inside the other."""
    first = btree(nranks, rank)
    if nranks % 2:
        moved = btree(nranks, (rank - 1) % nranks)
        second = tuple(-1 if x == -1 else (x + 1) % nranks for x in moved)
    else:
        moved = btree(nranks, nranks - 1 - rank)
        second = tuple(-1 if x == -1 else nranks - 1 - x for x in moved)
    return first, cast(tuple[int, int, int], second)  # btree's three, moved


def tree_parts(nodes: int, per_node: int) -> list[TreePart]:
    """The two trees of `tree` (ranks/collectives/tree.py) on N nodes x G positions: part t maps every
    position (a, j) to (parent, children), coordinates (node, position), children in fold order.
    Between nodes, tree t of dtree over the node indices; inside each node a chain over NVLink,
    positions 0, 1, ..., G-1 for tree 0 and G-1, ..., 1, 0 for tree 1 (the mirror, as tree 1 is
    between nodes for an even count), so the trees cross nodes on two rails, 0 and G-1, and their
    chains use each NVLink direction alike. A chain member's parent is the one before it, its child
    the one after; the head's parent is the parent node's head, its children the chain's next
    member, then the child nodes' heads (child 0, child 1): NCCL's tree.up / tree.down
    (src/graph/connect.cc: down[0] is the next GPU of the chain, then the nodes' children)."""
    N, G = nodes, per_node
    links = [dtree(N, a) for a in range(N)]
    out = []
    for t in (0, 1):
        h = t * (G - 1)
        part: TreePart = {}
        for a in range(N):
            chain = [(a, j) for j in (range(G) if t == 0 else range(G - 1, -1, -1))]
            up, d0, d1 = links[a][t]
            for i, at in enumerate(chain):
                below = [chain[i + 1]] if i + 1 < G else []
                if i == 0:
                    parent = None if up == -1 else (up, h)
                    below += [(d, h) for d in (d0, d1) if d != -1]
                else:
                    parent = chain[i - 1]
                part[at] = (parent, below)
        out.append(part)
    return out


def _height(part: TreePart, at: tuple[int, int]) -> int:
    return max((1 + _height(part, child) for child in part[at][1]), default=0)


def _depth(part: TreePart, at: tuple[int, int]) -> int:
    return 0 if part[at][0] is None else 1 + _depth(part, part[at][0])  # type: ignore[arg-type]  # not None here


def tree_steps(parts: list[TreePart], at: tuple[int, int]) -> list[tuple[int, int]]:
    """When member `at` of `tree` handles each part's chunks: per part of tree_parts, (up, down): at
    step s it reduces chunk s - up of the part (up = its height in the part's tree: a leaf at once,
    its parent one step after its tallest child) and passes chunk s - down on (down = the tree's
    height + its depth: the root sends a result down in the step it finishes it, each level one step
    later). Every message a member waits for was sent at an earlier step, so the steps never wait in
    a circle, and a step waits only for data in flight: the chunks stream up and down at once, as
    NCCL runs the two directions on split thread groups."""
    out = []
    for part in parts:
        root = next(x for x, (parent, _) in part.items() if parent is None)
        out.append((_height(part, at), _height(part, root) + _depth(part, at)))
    return out


def merged_columns(ranges: Sequence[Sequence[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """Per position j, the ranges ranges[0..][j] with empty ones dropped and adjacent ones merged
    (the segment a node ring passes for position j)."""
    out = []
    for j in range(len(ranges[0])):
        merged: list[tuple[int, int]] = []
        for lo, hi in (row[j] for row in ranges):
            if hi == lo:
                continue
            if merged and merged[-1][1] == lo:
                merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        out.append(merged)
    return out


def chunks(start: int, stop: int, step: int) -> list[tuple[int, int]]:
    """(start, stop) sub-ranges of at most `step` elements covering [start, stop); none if empty."""
    return [(s, min(s + step, stop)) for s in range(start, stop, step)]


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor (busbw = algbw x factor): AllReduce 2(N-1)/N; ReduceScatter,
    AllGather, All2All (N-1)/N; Broadcast 1."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    return 1.0 if collective == "broadcast" else (n - 1) / n
