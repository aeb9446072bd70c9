"""Helpers for workload scripts: time a step as `nvlink-emu run --compare` reads it, and charge numpy
kernels to the GPU compute model by the FLOPs and HBM bytes they really take.

The step line. GPU 0 prints one line per timed step, whole and alone (after its `[gpu 0] ` label):

    step_ns=<float> [step=<name>] [link_bytes=<int>] [start_ns=<float>]

`step_ns` is the step's modeled time in ns (the slowest GPU's); `step` names it when a script times
several kinds of step (`overlap` and `no-overlap`, say); `link_bytes` is the payload the step moved
over every GPU link, both directions (GPU -> switch and switch -> GPU), summed over the GPUs;
`start_ns` is the step's modeled start on GPU 0's clock (ns), so GPU 0's collective calls of the step
can be found in its run report (`run --compare --project-nodes` reads it). A script
that times several steps of one name prints a line for each; `--compare` averages them.
"""

import math
import re

import numpy as np

from nvlink_emu.fabric.errors import FabricError

STEP_KEY = "step_ns"
STEP_LINE_FORM = f"{STEP_KEY}=<float> [step=<name>] [link_bytes=<int>] [start_ns=<float>]"  # parse_step_line's errors
_LABEL = re.compile(r"^\[gpu (\d+)\] ")
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]+$")  # a step name: one token, so the line stays key=value pairs


def step_line(step_ns: float, name: str | None = None, link_bytes: int | None = None,
              start_ns: float | None = None) -> str:
    """The step line (without label) for a step of `step_ns` modeled ns, started at `start_ns` (GPU 0's clock)."""
    if not isinstance(step_ns, (int, float)) or not math.isfinite(step_ns) or step_ns < 0:
        raise FabricError(f"step_line: step_ns must be a finite, non-negative number of ns, got {step_ns!r}")
    if name is not None and not _NAME.match(name):
        raise FabricError(f"step_line: step name {name!r} must be one token of letters, digits and _.:+-")
    if start_ns is not None and (not isinstance(start_ns, (int, float)) or not math.isfinite(start_ns)
                                 or start_ns < 0):
        raise FabricError(f"step_line: start_ns must be a finite, non-negative number of ns, got {start_ns!r}")
    parts = [f"{STEP_KEY}={float(step_ns):.3f}"]
    if name is not None:
        parts.append(f"step={name}")
    if link_bytes is not None:
        parts.append(f"link_bytes={int(link_bytes)}")
    if start_ns is not None:
        parts.append(f"start_ns={float(start_ns)!r}")  # exact: calls are placed in their step by it
    return " ".join(parts)


def parse_step_line(line: str) -> dict | None:
    """{"step_ns": float, "step": str (None if unnamed), "link_bytes": int or None, "start_ns": float or
    None} of a step line GPU 0
    printed (labelled `[gpu 0] ` or not), or None for any other line (another GPU's, any other text).
    ValueError for a line that starts as a step line but does not parse."""
    label = _LABEL.match(line)
    if label and label.group(1) != "0":
        return None
    text = line[label.end():] if label else line
    if not text.startswith(f"{STEP_KEY}="):
        return None
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or key in fields or key not in (STEP_KEY, "step", "link_bytes", "start_ns"):
            raise ValueError(f"not a step line ({STEP_LINE_FORM}): {text!r}")
        fields[key] = value
    try:
        step_ns = float(fields[STEP_KEY])
        link_bytes = int(fields["link_bytes"]) if "link_bytes" in fields else None
        start_ns = float(fields["start_ns"]) if "start_ns" in fields else None
    except ValueError:
        raise ValueError(f"not a step line ({STEP_LINE_FORM}): {text!r}") from None
    if (not math.isfinite(step_ns) or step_ns < 0 or (link_bytes is not None and link_bytes < 0)
            or (start_ns is not None and (not math.isfinite(start_ns) or start_ns < 0))):
        raise ValueError(f"step line with a negative or non-finite value: {text!r}")
    return {"step_ns": step_ns, "step": fields.get("step"), "link_bytes": link_bytes, "start_ns": start_ns}


class timed_step:
    """`with timed_step(gpu, "name") as step:` times the body as one step of every GPU of `comm`
    (default gpu.world; every member must enter and leave it). On entry a barrier (every member
    leaves it at the latest member's clock), then each member reads its link counters and the
    members meet once more out of band, so no member's step traffic can reach a GPU that has not
    read them yet; on exit another barrier (it fences puts too, so every byte of the step has been
    counted at both ends), then step.ns = the clock at the end minus the common start (modeled ns)
    and step.link_bytes = the payload every member's links moved between the two (tx + rx, summed
    over the members: a GPU counts a transfer when it reaches its host, so without the meetings a
    fast peer's bytes could fall outside the step they belong to). step.start_ns: the common start
    (modeled ns). GPU 0 prints the step line (with start_ns) unless
    `quiet`. The meetings are out of band: they add no link bytes, and no modeled time beyond
    aligning the members' clocks at the barriers. An exception in the body propagates untimed."""

    def __init__(self, gpu, name: str | None = None, comm=None, quiet: bool = False):
        self.gpu, self.name, self.comm, self.quiet = gpu, name, comm or gpu.world, quiet
        self.ns: float | None = None
        self.link_bytes: int | None = None

    def _moved(self) -> int:
        counters = self.gpu.link_counters()
        return counters["tx_bytes"] + counters["rx_bytes"]

    def __enter__(self):
        self.comm.barrier()
        self.start_ns, self._before = self.gpu.now_ns, self._moved()
        self.comm.allgather_object(None, "timed_step start")
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None:
            return False
        self.comm.barrier()
        moved = self.comm.allgather_object(self._moved() - self._before, "timed_step end")
        self.ns = self.gpu.now_ns - self.start_ns  # the barrier gave every member the latest clock
        self.link_bytes = sum(moved)
        if self.gpu.rank == 0 and not self.quiet:
            print(step_line(self.ns, self.name, self.link_bytes, self.start_ns), flush=True)
        return False


# -- kernels charged to the GPU compute model --------------------------------------------------------
# Each does the numpy work and adds its roofline time (gpu.compute(flops=, bytes=, dtype=)): the
# FLOPs are the arithmetic the kernel does, the bytes what it reads from and writes to HBM once each
# (no operand reuse from caches across kernels, as for separate kernel launches). gpu=None does the
# numpy work alone: a one-process reference runs the same code and charges nobody.

def _charge(gpu, flops: int, nbytes: int, dtype) -> None:
    if gpu is not None and (flops or nbytes):  # a kernel on no elements is not launched
        # a kernel without arithmetic (a copy, a lookup of int64 indices) uses no math units: the
        # roofline takes its bytes alone, whatever the dtype, and the compute dtypes have no int64
        gpu.compute(flops=flops, bytes=nbytes, dtype=dtype if flops else None)


def matmul(gpu, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-D a (m x k) and b (k x n): 2mkn FLOPs, (mk + kn + mn) elements of HBM traffic."""
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or a.dtype != b.dtype:
        raise FabricError(f"matmul of {a.shape} {a.dtype} by {b.shape} {b.dtype}: shapes or dtypes differ")
    _charge(gpu, 2 * m * k * n, (m * k + k * n + m * n) * a.dtype.itemsize, a.dtype)
    return a @ b


def elementwise(gpu, result: np.ndarray, flops_per_element: int, reads: int, writes: int = 1) -> np.ndarray:
    """Charge an elementwise kernel over `result`'s elements (computed by the caller):
    flops_per_element each, `reads` input and `writes` output arrays of that size through HBM."""
    _charge(gpu, flops_per_element * result.size, (reads + writes) * result.nbytes, result.dtype)
    return result


def copy(gpu, array: np.ndarray) -> np.ndarray:
    """A copy of `array` (packing, concatenating or splitting buffers): no FLOPs, read once, written once."""
    _charge(gpu, 0, 2 * array.nbytes, array.dtype)
    return np.array(array)


def gather_rows(gpu, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """table[rows] (an embedding lookup): no FLOPs; the rows read, the indices read, the result written."""
    out = table[rows]
    _charge(gpu, 0, 2 * out.nbytes + rows.nbytes, table.dtype)
    return out


def pool(gpu, rows: np.ndarray) -> np.ndarray:
    """Sum-pool bags of looked-up rows, (bags, L, E) -> (bags, E): L - 1 adds per output element,
    the rows read, the result written."""
    out = rows.sum(axis=1)
    _charge(gpu, max(rows.shape[1] - 1, 0) * out.size, rows.nbytes + out.nbytes, rows.dtype)
    return out


def scatter_add(gpu, table: np.ndarray, rows: np.ndarray, values: np.ndarray, scale: float = 1.0) -> None:
    """table[rows] += scale * values, repeated rows accumulated in the order given (a sparse update of
    an embedding table): two FLOPs per element; each touched row read and written, values and indices
    read."""
    np.add.at(table, rows, np.asarray(scale, table.dtype) * values)
    _charge(gpu, 2 * values.size, 3 * values.nbytes + rows.nbytes, table.dtype)


# -- a ReLU MLP whose kernels are charged to a GPU (or to nobody: the one-process reference) ----------

class Mlp:
    """A ReLU MLP y = relu(...relu(x W1 + b1)...) W_L + b_L with layer widths `sizes` (inputs first),
    its parameters in one flat array: layer by layer, W (in x out, row-major) then b (out). Flat
    parameters make the gradient of the whole model one buffer (one AllReduce) and a bucket of
    layers one contiguous slice of it. forward/backward take `gpu`, whose compute model they charge
    (matmul, elementwise), or None for numpy alone (the reference). Kernels, per layer of a batch of
    m rows, in -> out: forward x W (matmul), + b and relu fused (2 FLOPs per output element, reads
    and writes it once); backward dW = x^T dy and dx = dy W^T (matmuls; dx skipped at the first
    layer unless asked for), db = column sums of dy (one FLOP per element), relu's mask on dx (one FLOP,
    reads dx and the activation, writes dx)."""

    def __init__(self, sizes: list[int]):
        self.sizes = list(sizes)
        self.slices = []  # per layer: (slice of W, slice of b) in the flat parameters
        at = 0
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            self.slices.append((slice(at, at + fan_in * fan_out), slice(at + fan_in * fan_out, at + (fan_in + 1) * fan_out)))
            at += (fan_in + 1) * fan_out
        self.count = at  # parameters (elements)

    def layer_range(self, first: int, last: int) -> slice:
        """The flat slice holding layers first..last (inclusive), in elements."""
        return slice(self.slices[first][0].start, self.slices[last][1].stop)

    def layers(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W, b) views of each layer in `flat` (parameters or gradients)."""
        return [(flat[w].reshape(fan_in, fan_out), flat[b])
                for (w, b), fan_in, fan_out in zip(self.slices, self.sizes, self.sizes[1:])]

    def init(self, rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
        """Flat parameters: LeCun-normal weights (standard deviation sqrt(1 / fan_in)), zero biases."""
        flat = np.zeros(self.count, dtype)
        for (w, _), fan_in in zip(self.layers(flat), self.sizes):
            w[:] = rng.standard_normal(w.shape) * np.sqrt(1.0 / fan_in)
        return flat

    def forward(self, gpu, flat: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, list]:
        """(output, the activations backward needs: every layer's input)."""
        inputs, h = [], x
        layers = self.layers(flat)
        for i, (w, b) in enumerate(layers):
            inputs.append(h)
            h = matmul(gpu, h, w) + b
            if i < len(layers) - 1:
                h = np.maximum(h, 0)
            elementwise(gpu, h, 2 if i < len(layers) - 1 else 1, reads=1)
        return h, inputs

    def backward(self, gpu, flat: np.ndarray, inputs: list, dy: np.ndarray, grads: np.ndarray,
                 on_layer=None, need_dx: bool = False) -> np.ndarray | None:
        """Gradients of the loss, given dy = dloss/doutput, into `grads` (flat, as the parameters), last
        layer first; on_layer(i), if given, runs as soon as layer i's gradients are in `grads` (a hook,
        as frameworks start a bucket's AllReduce). Returns dloss/dx if need_dx, else None."""
        layers, out = self.layers(flat), self.layers(grads)
        for i in range(len(layers) - 1, -1, -1):
            (w, _), (dw, db), x = layers[i], out[i], inputs[i]
            dw[:] = matmul(gpu, x.T, dy)
            db[:] = elementwise(gpu, dy, 1, reads=1, writes=0).sum(axis=0)
            if i > 0 or need_dx:
                dy = matmul(gpu, dy, w.T)
                if i > 0:
                    dy = elementwise(gpu, dy * (x > 0), 1, reads=2)  # x: relu's output of the layer below
            if on_layer is not None:
                on_layer(i)
        return dy if need_dx else None


def teacher_dataset(sizes: list[int], total: int, seed: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """A global batch of `total` samples: float32 inputs of width sizes[0] and the targets a fixed random
    'teacher' (tanh of a linear map to width sizes[-1]) gives them; the same on every GPU for a seed."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((total, sizes[0])).astype(np.float32)
    teacher = rng.standard_normal((sizes[0], sizes[-1])).astype(np.float32) / np.sqrt(sizes[0])
    return x, np.tanh(x @ teacher).astype(np.float32)


def sgd(gpu, flat: np.ndarray, grads: np.ndarray, lr: float) -> None:
    """flat -= lr * grads in place: two FLOPs per parameter, reads both arrays, writes one."""
    flat -= np.asarray(lr, flat.dtype) * grads
    elementwise(gpu, flat, 2, reads=2)


def mse_grad(gpu, y: np.ndarray, target: np.ndarray, batch: int) -> tuple[float, np.ndarray]:
    """(loss, dloss/dy) of loss = sum((y - target)^2) / (2 batch): the mean over `batch` rows of half
    the squared error. dy = (y - target) / batch: two FLOPs per element, reads two arrays, writes one."""
    diff = y - target
    dy = elementwise(gpu, diff * np.asarray(1.0 / batch, y.dtype), 2, reads=2)
    return float(np.sum(diff.astype(np.float64) ** 2) / (2 * batch)), dy
