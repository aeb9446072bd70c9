"""dlrm.py: a DLRM-style training step, embedding tables model-parallel and the MLPs data-parallel,
checked against one process holding every table and the whole batch.

The model: dense features -> bottom MLP -> a vector of E; categorical features -> sum-pooled bags of L
lookups in T small tables and one large one; the T + 2 vectors concatenated -> top MLP -> a score;
loss = mean over the batch of half the squared error against a target. Each GPU has its own samples.

- The T small tables are sharded **by table** (table t on GPU t mod N): each GPU sends its samples'
  indices of table t to t's owner (All2Allv: the owners hold different numbers of tables), the owner
  looks up and pools the bags of every sample, and sends them back (All2Allv).
- The large table is sharded **by row** (contiguous blocks of rows): each GPU tells every owner how
  many lookups it will send (All2All of counts), sends the indices (All2Allv, uneven: they follow the
  data), the owners send the rows back (All2Allv), and the GPU pools its own bags.
- Both MLPs are replicated: their gradients (one flat buffer) are averaged by AllReduce (op avg).
- The embedding gradients travel back the way the lookups came (All2Allv) and each owner applies
  them to its own rows (a sparse SGD update, repeated rows accumulated in sample order).

Compute (MLP matmuls, elementwise kernels, lookups, pooling, packing, sparse updates) is charged to
the preset's GPU profile by FLOPs and HBM bytes (nvlink_emu.launch.workload). After every step each
GPU compares its MLP weights and its shard of the tables with the one-process reference and raises
beyond float32 tolerance; GPU 0 prints the largest difference and the step line (step_ns=...).

    nvlink-emu run launch/examples/dlrm.py --gpus 4
    nvlink-emu run launch/examples/dlrm.py --gpus 4 --compare dgx-a100,dgx-h100,h100-ib,pcie-gen4
"""

import argparse
import sys

import numpy as np

from nvlink_emu.launch.workload import Mlp, copy, gather_rows, mse_grad, pool, scatter_add, sgd, timed_step

TOLERANCE = 1e-5  # largest |w - w_ref| allowed (float32, weights of order 1)


def arguments():
    parser = argparse.ArgumentParser(prog="dlrm.py")
    parser.add_argument("--batch", type=int, default=64, help="samples per GPU (default 64)")
    parser.add_argument("--tables", type=int, default=6, help="small tables, sharded by table (default 6)")
    parser.add_argument("--rows", type=int, default=2000, help="rows of each small table (default 2000)")
    parser.add_argument("--big-rows", type=int, default=20000, help="rows of the large table, sharded by row "
                        "(default 20000)")
    parser.add_argument("--dim", type=int, default=32, help="embedding dimension E (default 32)")
    parser.add_argument("--bag", type=int, default=4, help="lookups per bag, L (default 4)")
    parser.add_argument("--dense", type=int, default=16, help="dense features (default 16)")
    parser.add_argument("--hidden", type=int, default=128, help="width of the MLPs' hidden layers (default 128)")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    parser.add_argument("--name", help="the steps' name in GPU 0's step lines (default none)")
    return parser.parse_args(sys.argv[1:])


class Model:
    """The model's shapes and its one-process initial state (the same on every GPU: seeded)."""

    def __init__(self, args):
        E, T, H = args.dim, args.tables, args.hidden
        self.args = args
        self.bottom = Mlp([args.dense, H, E])
        self.top = Mlp([(T + 2) * E, H, H, 1])
        rng = np.random.default_rng(7)
        self.mlp = np.concatenate([self.bottom.init(rng), self.top.init(rng)])  # one flat buffer
        self.tables = [(rng.standard_normal((args.rows, E)) * 0.1).astype(np.float32) for _ in range(T)]
        self.big = (rng.standard_normal((args.big_rows, E)) * 0.1).astype(np.float32)

    def split(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The bottom and top MLPs' views of a flat MLP buffer (parameters or gradients)."""
        return flat[:self.bottom.count], flat[self.bottom.count:]


def batch(args, n: int, step: int):
    """Step `step`'s global batch: dense features, indices per small table (T, samples, L), indices of
    the large table (samples, L), targets."""
    rng = np.random.default_rng(1000 + step)
    total = n * args.batch
    dense = rng.standard_normal((total, args.dense)).astype(np.float32)
    small = rng.integers(0, args.rows, (args.tables, total, args.bag))
    big = rng.integers(0, args.big_rows, (total, args.bag))
    target = rng.standard_normal((total, 1)).astype(np.float32)
    return dense, small, big, target


def reference_step(model: Model, args, n: int, data) -> None:
    """One SGD step of the whole model on the whole batch, one process, numpy alone."""
    dense, small, big, target = data
    E, total = args.dim, n * args.batch
    bottom, top = model.split(model.mlp)
    z, bottom_inputs = model.bottom.forward(None, bottom, dense)
    pooled = [t[idx].sum(axis=1) for t, idx in zip(model.tables, small)] + [model.big[big].sum(axis=1)]
    y, top_inputs = model.top.forward(None, top, np.concatenate([z, *pooled], axis=1))
    _, dy = mse_grad(None, y, target, total)
    grads = np.empty_like(model.mlp)
    bottom_grads, top_grads = model.split(grads)
    dx = model.top.backward(None, top, top_inputs, dy, top_grads, need_dx=True)
    model.bottom.backward(None, bottom, bottom_inputs, dx[:, :E], bottom_grads)
    for t, (table, idx) in enumerate(zip(model.tables, small)):
        d = np.repeat(dx[:, (t + 1) * E:(t + 2) * E], args.bag, axis=0)
        scatter_add(None, table, idx.reshape(-1), d, -args.lr)
    scatter_add(None, model.big, big.reshape(-1), np.repeat(dx[:, -E:], args.bag, axis=0), -args.lr)
    sgd(None, model.mlp, grads, args.lr)


def main(gpu):
    args = arguments()
    n, r, b, E, L, T = gpu.size, gpu.rank, args.batch, args.dim, args.bag, args.tables
    comm = gpu.world
    reference = Model(args)  # one process: every table, the whole batch
    owner = [t % n for t in range(T)]  # table-wise sharding
    mine = [t for t in range(T) if owner[t] == r]
    ntables = [owner.count(j) for j in range(n)]
    bounds = np.linspace(0, args.big_rows, n + 1).astype(np.int64)  # row-wise sharding: rows bounds[j]..bounds[j+1]
    lo, hi = int(bounds[r]), int(bounds[r + 1])

    # this GPU's state: the replicated MLPs, its small tables, its rows of the large table
    mlp = gpu.alloc(reference.mlp.size, "float32")
    mlp[:] = reference.mlp
    grads = gpu.alloc(mlp.size, "float32")
    tables = {}
    for t in mine:
        tables[t] = gpu.alloc(args.rows * E, "float32").reshape(args.rows, E)
        tables[t][:] = reference.tables[t]
    shard = gpu.alloc((hi - lo) * E, "float32").reshape(hi - lo, E)
    shard[:] = reference.big[lo:hi]
    bottom, top = reference.split(mlp)
    bottom_grads, top_grads = reference.split(grads)
    if r == 0:
        print(f"dlrm: {n} GPUs x {b} samples; {T} tables of {args.rows} x {E} sharded by table (GPU t mod {n}), "
              f"one of {args.big_rows} x {E} sharded by row; bags of {L}; MLPs {reference.bottom.sizes} and "
              f"{reference.top.sizes} ({mlp.size} parameters) data-parallel; {args.steps} steps on {gpu.config.name}")

    for step in range(args.steps):
        data = batch(args, n, step)
        dense, small, big, target = data
        own = slice(r * b, (r + 1) * b)
        with timed_step(gpu, args.name) as timed:
            # -- forward: table-wise lookups. My samples' indices of each table go to its owner.
            send = copy(gpu, np.concatenate([small[t, own].reshape(-1) for j in range(n) for t in range(T)
                                             if owner[t] == j]))
            asked = np.empty(n * b * L * len(mine), np.int64)  # from GPU i: its b bags of each of my tables
            comm.all2allv(send, [ntables[j] * b * L for j in range(n)], asked, [len(mine) * b * L] * n)
            asked = asked.reshape(n, len(mine), b, L)
            bags = np.empty((n, len(mine), b, E), np.float32)
            for k, t in enumerate(mine):
                bags[:, k] = pool(gpu, gather_rows(gpu, tables[t], asked[:, k].reshape(-1, L))).reshape(n, b, E)
            pooled = np.empty(T * b * E, np.float32)  # from owner j: my bags of each of its tables
            comm.all2allv(bags.reshape(-1), [len(mine) * b * E] * n, pooled, [ntables[j] * b * E for j in range(n)])
            by_table, at = {}, 0
            for j in range(n):
                for t in (t for t in range(T) if owner[t] == j):
                    by_table[t] = pooled[at:at + b * E].reshape(b, E)
                    at += b * E

            # -- forward: row-wise lookups in the large table. Counts first, then indices, then rows.
            wanted = big[own].reshape(-1)
            row_owner = np.searchsorted(bounds, wanted, side="right") - 1
            order = np.argsort(row_owner, kind="stable")  # grouped by owner, sample order within each
            counts = np.bincount(row_owner, minlength=n).astype(np.int64)
            their = np.empty(n, np.int64)
            comm.all2all(counts, their)
            requests = np.empty(int(their.sum()), np.int64)
            comm.all2allv(copy(gpu, wanted[order]), counts.tolist(), requests, their.tolist())
            rows = gather_rows(gpu, shard, requests - lo)
            got = np.empty((b * L, E), np.float32)
            comm.all2allv(rows.reshape(-1), (their * E).tolist(), got.reshape(-1), (counts * E).tolist())
            looked_up = np.empty_like(got)
            looked_up[order] = got  # back into sample order
            big_pooled = pool(gpu, looked_up.reshape(b, L, E))

            # -- dense part: bottom MLP, concatenation, top MLP, loss
            z, bottom_inputs = reference.bottom.forward(gpu, bottom, dense[own])
            features = copy(gpu, np.concatenate([z, *(by_table[t] for t in range(T)), big_pooled], axis=1))
            y, top_inputs = reference.top.forward(gpu, top, features)
            _, dy = mse_grad(gpu, y, target[own], b)  # my samples' mean loss: gradients averaged below

            # -- backward: MLPs and their gradients averaged, then the embeddings' gradients back to their owners
            dx = reference.top.backward(gpu, top, top_inputs, dy, top_grads, need_dx=True)
            reference.bottom.backward(gpu, bottom, bottom_inputs, dx[:, :E].copy(), bottom_grads)
            comm.allreduce(grads, op="avg")
            # the loss is the mean over all n x b samples: my bags' gradients count 1/n of what my mean gave
            d_bags = copy(gpu, np.concatenate([dx[:, (t + 1) * E:(t + 2) * E].reshape(-1) for j in range(n)
                                               for t in range(T) if owner[t] == j]))
            d_mine = np.empty(n * len(mine) * b * E, np.float32)
            comm.all2allv(d_bags, [ntables[j] * b * E for j in range(n)], d_mine, [len(mine) * b * E] * n)
            d_mine = d_mine.reshape(n, len(mine), b, E)
            for k, t in enumerate(mine):
                d = np.repeat(d_mine[:, k].reshape(n * b, E), L, axis=0)  # each bag's gradient, to each of its rows
                scatter_add(gpu, tables[t], asked[:, k].reshape(-1), d, -args.lr / n)
            d_rows = copy(gpu, np.repeat(dx[:, -E:], L, axis=0)[order])
            d_requests = np.empty((len(requests), E), np.float32)
            comm.all2allv(d_rows.reshape(-1), (counts * E).tolist(), d_requests.reshape(-1), (their * E).tolist())
            scatter_add(gpu, shard, requests - lo, d_requests, -args.lr / n)
            sgd(gpu, mlp, grads, args.lr)

        reference_step(reference, args, n, data)
        diff = max([float(np.max(np.abs(mlp - reference.mlp))), float(np.max(np.abs(shard - reference.big[lo:hi])))]
                   + [float(np.max(np.abs(tables[t] - reference.tables[t]))) for t in mine])
        worst = max(comm.allgather_object(diff, "dlrm check"))
        if r == 0:
            print(f"step {step}: modeled {timed.ns / 1e3:.3f} us, {timed.link_bytes} link bytes; largest difference "
                  f"from the one-process reference (MLPs and every table) {worst:.3g} (tolerance {TOLERANCE:g})")
        if diff > TOLERANCE:
            raise AssertionError(f"GPU {r}: step {step}: weights or tables differ from the one-process reference by "
                                 f"{diff:.3g} > {TOLERANCE:g}")
