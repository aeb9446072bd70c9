"""dp_sgd.py: data-parallel SGD on a small MLP, checked every step against one process on the whole batch.

Every GPU holds the same MLP and its own slice of the global batch; it computes the gradient of its
slice's mean loss, the gradients (one flat buffer) are averaged by one AllReduce (op="avg"), and every
GPU takes the same step, theta <- theta - lr * g_avg. The mean of the slices' mean gradients is the
whole batch's mean gradient, so after every step the weights must equal those of a one-process numpy
SGD on the whole batch, to float32 rounding: GPU 0 prints the largest weight difference of any GPU,
and every GPU raises if its own exceeds the tolerance. Compute is charged to the preset's GPU
profile by FLOPs and HBM bytes (nvlink_emu.launch.workload); each step's modeled time is GPU 0's
step line (step_ns=...), which `nvlink-emu run --compare` reads.

    nvlink-emu run launch/examples/dp_sgd.py --gpus 4 -- --steps 5
    nvlink-emu run launch/examples/dp_sgd.py --gpus 4 --compare dgx-a100,dgx-h100,h100-ib,pcie-gen4
"""

import argparse
import sys

import numpy as np

from nvlink_emu.launch.workload import Mlp, mse_grad, sgd, teacher_dataset, timed_step

TOLERANCE = 1e-5  # largest |w - w_ref| allowed: ~100 float32 ulps at 1, far below any real mistake


def arguments():
    parser = argparse.ArgumentParser(prog="dp_sgd.py")
    parser.add_argument("--batch", type=int, default=64, help="samples per GPU (default 64)")
    parser.add_argument("--sizes", default="256,512,512,64", help="layer widths, inputs first (default 256,512,512,64)")
    parser.add_argument("--steps", type=int, default=3, help="SGD steps (default 3)")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate (default 0.02)")
    parser.add_argument("--algorithm", default="auto", help="the AllReduce's algorithm (default auto)")
    return parser.parse_args(sys.argv[1:])


def main(gpu):
    args = arguments()
    sizes = [int(s) for s in args.sizes.split(",")]
    mlp, n, b = Mlp(sizes), gpu.size, args.batch
    x, target = teacher_dataset(sizes, n * b)
    mine = slice(gpu.rank * b, (gpu.rank + 1) * b)  # this GPU's slice of the global batch
    x_mine, target_mine = x[mine].copy(), target[mine].copy()

    params = gpu.alloc(mlp.count, "float32")
    params[:] = mlp.init(np.random.default_rng(0))
    grads = gpu.alloc(mlp.count, "float32")
    reference = params.copy()  # one process, whole batch: numpy alone, no GPU, no fabric
    ref_grads = np.empty_like(reference)
    if gpu.rank == 0:
        print(f"dp_sgd: {n} GPUs x {b} samples, MLP {sizes} ({mlp.count} parameters, {4 * mlp.count} B of "
              f"gradients per AllReduce), {args.steps} steps on {gpu.config.name}")
    for step in range(args.steps):
        with timed_step(gpu) as timed:
            y, inputs = mlp.forward(gpu, params, x_mine)
            _, dy = mse_grad(gpu, y, target_mine, b)
            mlp.backward(gpu, params, inputs, dy, grads)
            gpu.world.allreduce(grads, op="avg", algorithm=args.algorithm)
            sgd(gpu, params, grads, args.lr)
        y_ref, inputs_ref = mlp.forward(None, reference, x)
        loss, dy_ref = mse_grad(None, y_ref, target, n * b)
        mlp.backward(None, reference, inputs_ref, dy_ref, ref_grads)
        sgd(None, reference, ref_grads, args.lr)
        diff = float(np.max(np.abs(params - reference)))
        worst = max(gpu.world.allgather_object(diff, "dp_sgd check"))
        if gpu.rank == 0:
            print(f"step {step}: loss {loss:.6f}, modeled {timed.ns / 1e3:.3f} us, largest weight difference "
                  f"from the one-process reference {worst:.3g} (tolerance {TOLERANCE:g})")
        if diff > TOLERANCE:
            raise AssertionError(f"GPU {gpu.rank}: step {step}: weights differ from the one-process reference by "
                                 f"{diff:.3g} > {TOLERANCE:g}")
