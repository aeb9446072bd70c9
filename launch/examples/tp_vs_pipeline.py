"""tp_vs_pipeline.py: one MLP's inference two ways on the same GPUs, tensor-parallel and layer-split
(pipeline), with the bytes and modeled time of each step, both checked against one process.

The MLP: `--layers` square layers of width H, y = relu(...relu(x W1 + b1)...) W_L + b_L, on a batch
of B rows (float32).

- **Tensor parallel** (Megatron-LM's MLP split): layers go in pairs; the first of a pair is split by
  columns (each GPU computes its H/N outputs, relu and all, on the whole batch), the second by rows
  (each GPU multiplies its H/N inputs by its rows of W, giving a partial sum of the whole output);
  an AllReduce (sum) of the B x H partial outputs completes the pair, then + b and relu. Every GPU
  ends with y. Bytes: one AllReduce of B x H x 4 bytes per pair of layers.
- **Pipeline** (layer split): GPU s holds a contiguous stage of the layers; the batch goes through in
  `--micro` micro-batches, each stage receiving a micro-batch's activations from the one before
  (comm.recv), computing, and sending them on (comm.send), so the stages work on different
  micro-batches at once. The last GPU ends with y. Bytes: B x H x 4 per stage boundary, N - 1 of them.

Every GPU holding y compares it with the one-process numpy reference and raises beyond float32
tolerance. Compute is charged to the preset's GPU profile by FLOPs and HBM bytes
(nvlink_emu.launch.workload). GPU 0 prints each way's step line (step=tensor-parallel and
step=pipeline, with step_ns and link_bytes), which `nvlink-emu run --compare` reads.

    nvlink-emu run launch/examples/tp_vs_pipeline.py --gpus 4
    nvlink-emu run launch/examples/tp_vs_pipeline.py --gpus 4 --compare dgx-a100,dgx-h100,h100-ib,pcie-gen4
"""

import argparse
import sys

import numpy as np

from nvlink_emu.fabric import ConfigError
from nvlink_emu.launch.workload import copy, elementwise, matmul, timed_step

ACTIVATIONS = 1  # the pipeline's message tag
TOLERANCE = 1e-4  # largest |y - y_ref| / max|y_ref| allowed: float32 sums of H products, in other orders


def arguments():
    parser = argparse.ArgumentParser(prog="tp_vs_pipeline.py")
    parser.add_argument("--batch", type=int, default=64, help="rows of the batch, B (default 64)")
    parser.add_argument("--width", type=int, default=1024, help="width of every layer, H (default 1024)")
    parser.add_argument("--layers", type=int, default=8, help="layers, an even number (default 8)")
    parser.add_argument("--micro", type=int, default=4, help="pipeline micro-batches (default 4)")
    parser.add_argument("--steps", type=int, default=2, help="steps of each way (default 2)")
    parser.add_argument("--algorithm", default="auto", help="tensor parallelism's AllReduce algorithm (default auto)")
    return parser.parse_args(sys.argv[1:])


def model(args):
    """Weights and biases of every layer, and the batch (seeded: the same on every GPU)."""
    rng = np.random.default_rng(3)
    H = args.width
    weights = [(rng.standard_normal((H, H)) * np.sqrt(2.0 / H)).astype(np.float32) for _ in range(args.layers)]
    biases = [(rng.standard_normal(H) * 0.1).astype(np.float32) for _ in range(args.layers)]
    x = rng.standard_normal((args.batch, H)).astype(np.float32)
    return weights, biases, x


def reference(weights, biases, x):
    """The MLP on one process, numpy alone."""
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = h @ w + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0)
    return h


def layer_out(gpu, h: np.ndarray, b: np.ndarray, last: bool) -> np.ndarray:
    """h + b, then relu unless it is the last layer: one fused elementwise kernel."""
    out = h + b if last else np.maximum(h + b, 0)
    return elementwise(gpu, out, 1 if last else 2, reads=1)


def check(gpu, y: np.ndarray, y_ref: np.ndarray, how: str) -> float:
    error = float(np.max(np.abs(y - y_ref)) / np.max(np.abs(y_ref)))
    if error > TOLERANCE:
        raise AssertionError(f"GPU {gpu.rank}: {how}: output differs from the one-process reference by {error:.3g} "
                             f"(relative) > {TOLERANCE:g}")
    return error


def tensor_parallel(gpu, args, shards, biases, x):
    """One step of Megatron-style tensor parallelism with this GPU's `shards` (tp_shards). Returns y
    (every GPU has it)."""
    h = x
    for pair in range(args.layers // 2):
        w_col, b_col, w_row = shards[pair]
        inner = layer_out(gpu, matmul(gpu, h, w_col), b_col, last=False)  # B x H/N, no communication
        buffer = gpu.alloc(args.batch * args.width, "float32")
        partial = buffer.reshape(args.batch, args.width)
        partial[:] = matmul(gpu, inner, w_row)  # this GPU's share of the sum over the inner width
        gpu.world.allreduce(partial, op="sum", algorithm=args.algorithm)
        h = layer_out(gpu, partial, biases[2 * pair + 1], last=2 * pair + 1 == args.layers - 1)
        gpu.free(buffer)
    return h


def tp_shards(gpu, args, weights, biases):
    """This GPU's tensor-parallel shards, per pair: W1's columns, b1's, W2's rows (in GPU memory)."""
    cols = np.array_split(np.arange(args.width), gpu.size)[gpu.rank]
    shards = []
    for pair in range(args.layers // 2):
        w1, b1, w2 = weights[2 * pair], biases[2 * pair], weights[2 * pair + 1]
        parts = [gpu.alloc(w1.shape[0] * cols.size, "float32").reshape(w1.shape[0], cols.size),
                 gpu.alloc(cols.size, "float32"), gpu.alloc(cols.size * w2.shape[1], "float32").reshape(cols.size, -1)]
        parts[0][:], parts[1][:], parts[2][:] = w1[:, cols], b1[cols], w2[cols, :]
        shards.append(parts)
    return shards


def pipeline(gpu, args, stage: dict, biases, x):
    """One step of the layer split: this GPU runs `stage` (its layers: index -> W in GPU memory) on
    every micro-batch. Returns y on the last GPU, None on the others."""
    n, r, comm = gpu.size, gpu.rank, gpu.world
    outputs = []
    for rows in np.array_split(np.arange(args.batch), args.micro):
        buffer = gpu.alloc(rows.size * args.width, "float32")
        h = buffer.reshape(rows.size, args.width)
        if r == 0:
            h[:] = x[rows]
        else:
            comm.recv(h, r - 1, tag=ACTIVATIONS)  # the micro-batch's activations from the stage before
        for i in stage:
            h[:] = layer_out(gpu, matmul(gpu, h, stage[i]), biases[i], last=i == args.layers - 1)
        if r < n - 1:
            comm.send(h, r + 1, tag=ACTIVATIONS)  # returns once h's bytes have left: it may be freed
        else:
            outputs.append(copy(gpu, h))
        gpu.free(buffer)
    return np.concatenate(outputs) if outputs else None


def main(gpu):
    args = arguments()
    n, r = gpu.size, gpu.rank
    if args.layers % 2 or args.layers < n or n < 2:
        raise ConfigError(f"tp_vs_pipeline.py: needs 2 or more GPUs and an even number of layers, at least one per "
                          f"GPU: got {n} GPUs, --layers {args.layers}")
    weights, biases, x = model(args)
    y_ref = reference(weights, biases, x)
    S = args.batch * args.width * 4  # bytes of one activation of the whole batch
    if r == 0:
        print(f"tp_vs_pipeline: MLP of {args.layers} layers of {args.width} x {args.width}, batch {args.batch}, "
              f"float32, on {n} GPUs of {gpu.config.name}; activations {S} B")

    shards = tp_shards(gpu, args, weights, biases)
    for step in range(args.steps):
        with timed_step(gpu, "tensor-parallel") as tp:
            y = tensor_parallel(gpu, args, shards, biases, x)
        tp_error = max(gpu.world.allgather_object(check(gpu, y, y_ref, "tensor parallel"), "tp check"))

    stage = {}  # this GPU's contiguous stage of the layers, in its memory
    for i in np.array_split(np.arange(args.layers), n)[r]:
        stage[int(i)] = gpu.alloc(args.width * args.width, "float32").reshape(args.width, args.width)
        stage[int(i)][:] = weights[i]
    for step in range(args.steps):
        with timed_step(gpu, "pipeline") as pp:
            y = pipeline(gpu, args, stage, biases, x)
        pp_error = max(gpu.world.allgather_object(check(gpu, y, y_ref, "pipeline") if y is not None else 0.0,
                                                  "pipeline check"))
    if r == 0:
        for how, timed, error, detail in (
                ("tensor parallel", tp, tp_error, f"{args.layers // 2} AllReduces of {S} B"),
                ("pipeline", pp, pp_error, f"{args.micro} micro-batches through {n} stages, {n - 1} boundaries of "
                                           f"{S} B")):
            print(f"{how:>16}: modeled {timed.ns / 1e3:10.3f} us per step, {timed.link_bytes:>10} link bytes per step "
                  f"({detail}); largest relative difference from the one-process reference {error:.3g}")
