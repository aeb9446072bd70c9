"""Helpers for workload scripts: time a step as `nvlink-emu run --compare` reads it, and charge numpy
kernels to the GPU compute model by the FLOPs and HBM bytes they really take.

The step line. GPU 0 prints one line per timed step, whole and alone (after its `[gpu 0] ` label):

    step_ns=<float> [step=<name>] [link_bytes=<int>]

`step_ns` is the step's modeled time in ns (the slowest GPU's); `step` names it when a script times
several kinds of step (`overlap` and `no-overlap`, say); `link_bytes` is the payload the step moved
over every GPU link, both directions (GPU -> switch and switch -> GPU), summed over the GPUs. A script
that times several steps of one name prints a line for each; `--compare` averages them.
"""

import math
import re

import numpy as np

from nvlink_emu.fabric.errors import FabricError

STEP_KEY = "step_ns"
_LABEL = re.compile(r"^\[gpu (\d+)\] ")
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]+$")  # a step name: one token, so the line stays key=value pairs


def step_line(step_ns: float, name: str | None = None, link_bytes: int | None = None) -> str:
    """The step line (without label) for a step of `step_ns` modeled ns."""
    if not isinstance(step_ns, (int, float)) or not math.isfinite(step_ns) or step_ns < 0:
        raise FabricError(f"step_line: step_ns must be a finite, non-negative number of ns, got {step_ns!r}")
    if name is not None and not _NAME.match(name):
        raise FabricError(f"step_line: step name {name!r} must be one token of letters, digits and _.:+-")
    parts = [f"{STEP_KEY}={float(step_ns):.3f}"]
    if name is not None:
        parts.append(f"step={name}")
    if link_bytes is not None:
        parts.append(f"link_bytes={int(link_bytes)}")
    return " ".join(parts)


def parse_step_line(line: str) -> dict | None:
    """{"step_ns": float, "step": str (None if unnamed), "link_bytes": int or None} of a step line GPU 0
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
        if not sep or key in fields or key not in (STEP_KEY, "step", "link_bytes"):
            raise ValueError(f"not a step line ({STEP_KEY}=<float> [step=<name>] [link_bytes=<int>]): {text!r}")
        fields[key] = value
    try:
        step_ns = float(fields[STEP_KEY])
        link_bytes = int(fields["link_bytes"]) if "link_bytes" in fields else None
    except ValueError:
        raise ValueError(f"not a step line ({STEP_KEY}=<float> [step=<name>] [link_bytes=<int>]): {text!r}") from None
    if not math.isfinite(step_ns) or step_ns < 0 or (link_bytes is not None and link_bytes < 0):
        raise ValueError(f"step line with a negative or non-finite value: {text!r}")
    return {"step_ns": step_ns, "step": fields.get("step"), "link_bytes": link_bytes}


class timed_step:
    """`with timed_step(gpu, "name") as step:` times the body as one step of every GPU of `comm`
    (default gpu.world; every member must enter and leave it): a barrier first, so all start at the
    latest member's clock; at the end, step.ns = the latest member's clock minus that start (modeled
    ns) and step.link_bytes = the payload every member's links moved meanwhile (tx + rx, summed);
    GPU 0 prints the step line unless `quiet`. Out-of-band exchanges only: the timing costs no
    modeled time and no link bytes. An exception in the body propagates untimed."""

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
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None:
            return False
        ends = self.comm.allgather_object((self.gpu.now_ns, self._moved() - self._before), "timed_step")
        self.ns = max(end for end, _ in ends) - self.start_ns
        self.link_bytes = sum(moved for _, moved in ends)
        if self.gpu.rank == 0 and not self.quiet:
            print(step_line(self.ns, self.name, self.link_bytes), flush=True)
        return False


# -- kernels charged to the GPU compute model --------------------------------------------------------
# Each does the numpy work and adds its roofline time (gpu.compute(flops=, bytes=, dtype=)): the
# FLOPs are the arithmetic the kernel does, the bytes what it reads from and writes to HBM once each
# (no operand reuse from caches across kernels, as for separate kernel launches).

def matmul(gpu, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-D a (m x k) and b (k x n): 2mkn FLOPs, (mk + kn + mn) elements of HBM traffic."""
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or a.dtype != b.dtype:
        raise FabricError(f"GPU {gpu.rank}: matmul of {a.shape} {a.dtype} by {b.shape} {b.dtype}: shapes or "
                          f"dtypes differ")
    gpu.compute(flops=2 * m * k * n, bytes=(m * k + k * n + m * n) * a.dtype.itemsize, dtype=a.dtype)
    return a @ b


def elementwise(gpu, result: np.ndarray, flops_per_element: int, reads: int, writes: int = 1):
    """Charge an elementwise kernel over `result`'s elements: flops_per_element each, `reads` input and
    `writes` output arrays of that size through HBM. Returns `result` (computed by the caller)."""
    n, itemsize = result.size, result.dtype.itemsize
    gpu.compute(flops=flops_per_element * n, bytes=(reads + writes) * n * itemsize, dtype=result.dtype)
    return result


def gather_rows(gpu, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """table[rows] (an embedding lookup): no FLOPs; the rows read, the indices read, the result written."""
    out = table[rows]
    gpu.compute(flops=0, bytes=2 * out.nbytes + rows.nbytes, dtype=table.dtype)
    return out


def scatter_add(gpu, table: np.ndarray, rows: np.ndarray, values: np.ndarray, scale: float = 1.0) -> None:
    """table[rows] += scale * values, repeated rows accumulated in order (a sparse update of an
    embedding table): two FLOPs per element; each touched row read and written, values and indices read."""
    np.add.at(table, rows, (scale * values).astype(table.dtype))
    gpu.compute(flops=2 * values.size, bytes=3 * values.nbytes + rows.nbytes, dtype=table.dtype)
