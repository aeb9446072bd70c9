"""dp_overlap.py: data-parallel SGD with bucketed gradients whose AllReduces overlap the backward pass,
against the same buckets reduced after it; both checked every step against one process on the whole batch.

As dp_sgd.py, but the flat gradient buffer is cut into buckets of whole layers (from the last layer
back, each at least --bucket-bytes), as PyTorch DDP does. **Overlap**: as soon as backward has written
the last gradient of a bucket (a hook after each layer), that bucket's AllReduce (avg) is issued
non-blocking (comm.iallreduce) and the backward pass goes on computing the layers below while it runs
on the links; before the update, gpu.wait_all waits for them all. **No overlap**: the same backward,
then the same buckets' AllReduces one after the other. Both runs start from the same weights and take
the same steps; after every step both must equal the one-process numpy SGD on the whole batch, to
float32 rounding (every GPU raises beyond the tolerance; GPU 0 prints the largest difference).

In modeled time the overlapped step is about forward + max(backward, communication) + what cannot
overlap (the first layer's bucket, whose gradients come last, and the update), and the other is
forward + backward + communication + update: GPU 0 prints both, the backward's compute time and the
communication time, and a step line for each (step=overlap, step=no-overlap) for `run --compare`.

    nvlink-emu run launch/examples/dp_overlap.py --gpus 4
    nvlink-emu run launch/examples/dp_overlap.py --gpus 4 --compare dgx-a100,dgx-h100,h100-ib,pcie-gen4
"""

import argparse
import sys

import numpy as np

from nvlink_emu.launch.workload import Mlp, mse_grad, sgd, teacher_dataset, timed_step

TOLERANCE = 1e-5  # largest |w - w_ref| allowed: ~100 float32 ulps at 1


def arguments():
    parser = argparse.ArgumentParser(prog="dp_overlap.py")
    parser.add_argument("--batch", type=int, default=128, help="samples per GPU (default 128)")
    parser.add_argument("--sizes", default="512,1024,1024,1024,1024,64",
                        help="layer widths, inputs first (default 512,1024,1024,1024,1024,64)")
    parser.add_argument("--bucket-bytes", type=int, default=1 << 20, help="smallest bucket (default 1 MiB)")
    parser.add_argument("--steps", type=int, default=2, help="SGD steps of each run (default 2)")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate (default 0.02)")
    parser.add_argument("--algorithm", default="auto", help="the AllReduces' algorithm (default auto)")
    return parser.parse_args(sys.argv[1:])


def buckets(mlp: Mlp, bucket_bytes: int) -> list[tuple[int, int]]:
    """Buckets as (first layer, last layer), the last layers first (backward's order): whole layers,
    each bucket at least bucket_bytes of float32 gradients (the first layers' bucket may be smaller)."""
    out, last, size = [], len(mlp.slices) - 1, 0
    for i in range(len(mlp.slices) - 1, -1, -1):
        w, b = mlp.slices[i]
        size += 4 * (w.stop - w.start + b.stop - b.start)
        if size >= bucket_bytes or i == 0:
            out.append((i, last))
            last, size = i - 1, 0
    return out


def main(gpu):
    args = arguments()
    sizes = [int(s) for s in args.sizes.split(",")]
    mlp, n, b, comm = Mlp(sizes), gpu.size, args.batch, gpu.world
    plan = buckets(mlp, args.bucket_bytes)
    x, target = teacher_dataset(sizes, n * b)
    mine = slice(gpu.rank * b, (gpu.rank + 1) * b)
    x_mine, target_mine = x[mine].copy(), target[mine].copy()
    start = mlp.init(np.random.default_rng(0))
    runs = {}
    for how in ("overlap", "no-overlap"):
        params, grads = gpu.alloc(mlp.count, "float32"), gpu.alloc(mlp.count, "float32")
        params[:] = start
        runs[how] = (params, grads)
    reference, ref_grads = start.copy(), np.empty_like(start)
    if gpu.rank == 0:
        print(f"dp_overlap: {n} GPUs x {b} samples, MLP {sizes} ({4 * mlp.count} B of gradients), buckets of "
              f"layers {[f'{f}-{l}' for f, l in plan]} ({[4 * (mlp.layer_range(f, l).stop - mlp.layer_range(f, l).start) for f, l in plan]} B), "
              f"{args.steps} steps each way on {gpu.config.name}")

    for step in range(args.steps):
        times = {}
        for how, (params, grads) in runs.items():
            with timed_step(gpu, how) as timed:
                y, inputs = mlp.forward(gpu, params, x_mine)
                _, dy = mse_grad(gpu, y, target_mine, b)
                if how == "overlap":
                    requests, ready = [], {first: last for first, last in plan}

                    def hook(i, grads=grads, requests=requests, ready=ready):
                        if i in ready:  # layer i is its bucket's first: every gradient of the bucket is in
                            requests.append(comm.iallreduce(grads[mlp.layer_range(i, ready[i])], op="avg",
                                                            algorithm=args.algorithm))

                    mlp.backward(gpu, params, inputs, dy, grads, on_layer=hook)
                    gpu.wait_all(requests)
                else:
                    before = gpu.now_ns
                    mlp.backward(gpu, params, inputs, dy, grads)
                    backward_ns, before = gpu.now_ns - before, gpu.now_ns
                    for first, last in plan:
                        comm.allreduce(grads[mlp.layer_range(first, last)], op="avg", algorithm=args.algorithm)
                    communication_ns = gpu.now_ns - before
                sgd(gpu, params, grads, args.lr)
            times[how] = timed.ns
        y_ref, inputs_ref = mlp.forward(None, reference, x)
        loss, dy_ref = mse_grad(None, y_ref, target, n * b)
        mlp.backward(None, reference, inputs_ref, dy_ref, ref_grads)
        sgd(None, reference, ref_grads, args.lr)
        diffs = {how: float(np.max(np.abs(params - reference))) for how, (params, _) in runs.items()}
        worst = {how: max(d) for how, d in zip(diffs, zip(*comm.allgather_object(list(diffs.values()), "check")))}
        if gpu.rank == 0:
            saved = times["no-overlap"] - times["overlap"]
            print(f"step {step}: loss {loss:.6f}; modeled step {times['overlap'] / 1e3:.3f} us with overlap, "
                  f"{times['no-overlap'] / 1e3:.3f} us without ({saved / 1e3:.3f} us, "
                  f"{100 * saved / times['no-overlap']:.1f}% saved; GPU 0's backward compute "
                  f"{backward_ns / 1e3:.3f} us, its AllReduces alone {communication_ns / 1e3:.3f} us); largest weight "
                  f"difference from the one-process reference {worst['overlap']:.3g} / {worst['no-overlap']:.3g} "
                  f"(tolerance {TOLERANCE:g})")
        for how, diff in diffs.items():
            if diff > TOLERANCE:
                raise AssertionError(f"GPU {gpu.rank}: step {step} ({how}): weights differ from the one-process "
                                     f"reference by {diff:.3g} > {TOLERANCE:g}")
