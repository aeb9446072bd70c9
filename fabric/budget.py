"""The in-switch buffer's budget, the one rule the switches enforce and the senders and the cost model plan
by: each partition's share of switch_buffer_bytes, what a held contribution counts against it, the credit
streams each in-switch algorithm keeps (so its window fits), the chunk and window of an in-switch
reduction, and the LOADs an honest nvls keeps unanswered. Pure: fabric.switch refuses what exceeds it,
ranks/collectives size their windows with it, fabric.cost, cost_nodes and replay time what it allows."""

from typing import cast

import numpy as np
import numpy.typing as npt

from .config import FabricConfig
from .reduction import DTYPES, switch_accumulator


# -- shares of the switch buffer --------------------------------------------------------------------------
def buffer_share_bytes(config: FabricConfig) -> int:
    """In-switch buffer for held contributions each partition may use, in bytes (an equal share)."""
    return config.switch_buffer_bytes // len(config.partitions)


def port_share_bytes(config: FabricConfig) -> int:
    """Forwarded bytes the switch keeps in flight to one port at most, in bytes (an equal share of
    switch_buffer_bytes; a port with nothing in flight always takes one more transfer)."""
    return config.switch_buffer_bytes // (config.gpus_per_node + cast(int, config.spines))  # set by __post_init__


def held_parts_share(config: FabricConfig) -> int:
    """Contributions each partition may have held at once (a count): share // slot_bytes, so that held slots
    counted at least slot_bytes each stay within the share. slot_bytes is share // the larger of 4,096, share /
    1 KiB and _least_parts (1 KiB on shares of 4 MiB and more: 4,096 slots on a 4 MiB share)."""
    return buffer_share_bytes(config) // held_slot_bytes(config)


def held_slot_bytes(config: FabricConfig) -> int:
    """What each held contribution counts at least against its partition's share (bytes): a held slot takes
    about 0.7 KiB of switch memory however few bytes it holds (tests/unit/test_switch_span_order_and_costs.py). The credit
    windows count each chunk at least this (Call.in_switch_window), so an honest window fits both bounds."""
    share = buffer_share_bytes(config)
    return max(1, share // max(4096, share // 1024, _least_parts(config)))


def _least_parts(config: FabricConfig) -> int:
    """The most contributions honest in-switch reductions hold when their window is the least they run with
    (Call.in_switch_window's `least`: 1 for sharp's allreduce, 2 for its reduce_scatter and nvls, shrinking
    the chunk does not shrink it): least x streams x (n - 1) over n = 2 .. the largest partition's GPUs, one
    node or several, every accumulator width. Over 4,096 from 46 GPUs in a partition on one node (2 n (n - 1)), from
    24 across 2 nodes (nvls: 8 n (n - 1), 16-bit floats); 4,512 for 48 on one node."""
    largest = max(len(members) for members in config.partitions) if config.partitions else config.gpus
    most = 0
    for n in range(2, largest + 1):
        for nodes in ((1, 2) if config.nodes > 1 else (1,)):
            for wide in (1, 2):  # fabric.reduction.switch_accumulator: as wide, or twice (16-bit floats)
                most = max(most, (n - 1) * max(sharp_streams(n, nodes, config.nodes, wide),
                                               2 * sharp_scatter_streams(n, nodes, config.nodes, wide),
                                               2 * nvls_streams_wide(n, nodes, config.nodes, wide)))
    return most


def honest_loads(config: FabricConfig) -> int:
    """The most LOADs of spanning groups an honest nvls call keeps unanswered to one GPU at its leaf: each of
    its n members keeps at most its window of load-reduce requests awaiting their result (nvls.py: a new
    one goes once a result is back, which needs every member's answer), each a LOAD to every member, so n x
    window; the window is Call.in_switch_window's with nvls.streams (nvls_streams: 2 n x the accumulator's
    width / the dtype's x ceil(nodes / (n - 1))) and nvls_chunk_bytes (in_switch_chunk), at least 2. The largest over n = 2 .. the largest partition's GPUs and every
    reduction dtype: about buffer share / (2 x nodes x nvls chunk) (128 on the presets at 2 nodes), at
    least 2 n. hier's node groups are one leaf's, whose LOADs a leaf does not count (it stops reading a
    GPU past MAX_UNREAD unread answers instead); 0 on one node (no group spans nodes)."""
    if config.nodes < 2:
        return 0
    share = buffer_share_bytes(config)
    largest = max(len(members) for members in config.partitions) if config.partitions else config.gpus
    kinds = {(dtype.itemsize, switch_accumulator(dtype).itemsize): dtype for dtype in DTYPES.values()}
    most = 0
    for n in range(2, largest + 1):
        for dtype in kinds.values():
            streams = nvls_streams(n, 2, config.nodes, dtype)
            chunk = in_switch_chunk(config, n, streams, 2, config.nvls_chunk_bytes, dtype.itemsize)
            window = max(2, share // (streams * (n - 1)) // chunk)
            most = max(most, n * window)
    return most


# -- credit streams of the in-switch algorithms (ranks/collectives sharp.py, nvls.py) -----------------
def sharp_streams(n: int, nodes: int, fabric_nodes: int, wide: int) -> int:
    """Credit streams of ranks/collectives/sharp.py's allreduce by `n` members in `nodes` nodes of a fabric of
    `fabric_nodes` (Call.in_switch_window), its partials `wide` times as wide as an element: 1 on one node;
    across nodes enough that a leaf's partials in flight (window x chunk x wide) fit its buffer share /
    fabric_nodes."""
    return 1 if nodes == 1 else wide * -(-fabric_nodes // max(1, n - 1))


def sharp_scatter_streams(n: int, nodes: int, fabric_nodes: int, wide: int) -> int:
    """Credit streams of sharp.py's reduce_scatter: n on one node (n blocks in flight a round); across nodes
    enough that twice a window of rounds of every block's partials (2 x window x n x chunk x wide) fit a
    leaf's buffer share / fabric_nodes (a leaf frees a partial whose result goes to another node when its
    spine's notice comes, which may lag the member's own results from another spine, hence the 2)."""
    return n if nodes == 1 else -(-2 * n * fabric_nodes * wide // max(1, n - 1))


def nvls_streams(n: int, nodes: int, fabric_nodes: int, dtype: npt.DTypeLike) -> int:
    """Credit streams of ranks/collectives/nvls.py's load-reduce by `n` members in `nodes` nodes of a fabric
    of `fabric_nodes` (Call.in_switch_window): n on one node; across nodes 2 n x (the accumulator's width
    / the dtype's) x ceil(fabric_nodes / (n - 1)), so that each leaf's partials awaiting their result or
    notice (n requesters' windows, twice: a notice may trail the next request) fit its buffer share /
    fabric_nodes (docs/design/architecture.md, Spanning groups)."""
    wide = switch_accumulator(np.dtype(dtype)).itemsize // np.dtype(dtype).itemsize
    return nvls_streams_wide(n, nodes, fabric_nodes, wide)


def nvls_streams_wide(n: int, nodes: int, fabric_nodes: int, wide: int) -> int:
    """nvls_streams for a partial `wide` times as wide as an element (the accumulator's width / the dtype's)."""
    return n if nodes == 1 else 2 * n * wide * -(-fabric_nodes // max(1, n - 1))


# -- an in-switch reduction's chunk and window (Call.in_switch_window) ----------------------------------
def in_switch_chunk(config: FabricConfig, n: int, streams: int, least: int = 1, chunk_bytes: int | None = None,
                    itemsize: int = 4) -> int:
    """Message size (bytes, whole elements) of an in-switch reduction: chunk_bytes (default and at
    most config.chunk_bytes), shrunk so that `least` chunks of each of `streams` reductions from the
    N - 1 other members fit the partition's share of switch_buffer_bytes (Call.in_switch_window)."""
    budget = buffer_share_bytes(config) // (streams * max(1, n - 1))
    wanted = min(chunk_bytes or config.chunk_bytes, config.chunk_bytes)
    return max(1, min(wanted, budget // least) // itemsize) * itemsize


def in_switch_window(config: FabricConfig, n: int, streams: int, least: int = 1, chunk_bytes: int | None = None,
                     itemsize: int = 4) -> tuple[int, int]:
    """(window, chunk bytes) of an in-switch reduction (Call.in_switch_window): the chunk of in_switch_chunk,
    and the chunks each member may have in the switch at once, at least `least`, so that window x streams x
    (N - 1) contributions, each counted at least held_slot_bytes (as the switch counts a held
    one), fit the partition's share; so they are also at most its held_parts_share (share // slot bytes).
    The same window as bytes alone for chunks of slot bytes or more (1 KiB on shares of 4 MiB and more)."""
    budget = buffer_share_bytes(config) // (streams * max(1, n - 1))
    chunk = in_switch_chunk(config, n, streams, least, chunk_bytes, itemsize)
    return max(least, budget // max(chunk, held_slot_bytes(config))), chunk
