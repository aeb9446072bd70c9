"""The demo's part 4: the NVLink Network across nodes against InfiniBand SuperPODs.

Emulated: launch/examples/superpod_steps.py (an All2All and an AllReduce of 1 MiB per GPU, one DLRM
step with its compute) on superpod-a100-ib, superpod-h100-ib and superpod-h100-nvlink at 2 nodes x 4
GPUs, one job each; per step the modeled time, busbw and the speed-up over the first preset, and per
run the payload bytes on each level as the switches counted them. Predicted: the two collectives at
32 nodes x 8 GPUs by the cost model (fabric.cost_nodes: the replay emulated runs are checked against),
never emulated here."""

import argparse
import multiprocessing
import sys
import time

from nvlink_emu.fabric.cost import bus_factor

from .compare import level_bytes, plot_steps, run_each
from .model import predict
from .options import fabric_of

PRESETS = ("superpod-a100-ib", "superpod-h100-ib", "superpod-h100-nvlink")
NODES, PER_NODE = 2, 4              # emulated: 2 x (4 GPUs + a leaf) + 4 spines = 14 ranks
BIG_NODES, BIG_PER_NODE = 32, 8     # predicted: the NVLink Switch System's full size, 256 GPUs
SIZE = 1 << 20                      # bytes per GPU of each collective (superpod_steps.SIZE)
COLLECTIVES = ("all2all", "allreduce")


def emulate(args, launch_script, progress, script: str) -> dict:
    """{preset: (step summary, run report)} of superpod_steps.py on each preset at NODES x PER_NODE."""
    run_args = argparse.Namespace(**{**vars(args), "script": script, "nodes": NODES, "gpus_per_node": PER_NODE,
                                     "gpus": None, "preset": None, "config": None, "no_label": False,
                                     "report_json": None, "trace_dir": None,
                                     "faults": None})  # a --faults plan names part 1's links, not these fabrics'
    configs = {name: fabric_of(run_args, name) for name in PRESETS}
    return run_each(run_args, [], launch_script, progress, configs)


def algorithms(report: dict) -> dict[str, str]:
    """{collective: the algorithm auto ran} of the two timed collectives, from GPU 0's call records
    (the first call of each collective on SIZE bytes: the DLRM step's calls come after them)."""
    found: dict[str, str] = {}
    for record in report["collectives"]:
        if record["gpu"] == 0 and record["size_bytes"] == SIZE and record["collective"] in COLLECTIVES:
            found.setdefault(record["collective"], record["algorithm"])
    return found


def step_table(results: dict, gpus: int) -> str:
    """A row per preset and step: the algorithm auto ran (the collectives), modeled us, busbw (GB/s,
    nccl-tests' factors), the speed-up over the first preset (its time / this one's) and the GPU links'
    payload bytes of the step."""
    first = PRESETS[0]
    lines = [f"# emulated, {NODES} nodes x {PER_NODE} GPUs: algorithm (auto), modeled time of each step (the "
             f"slowest GPU's), busbw, speed-up = {first}'s time / this one's, GPU-link payload bytes of the step "
             f"(every GPU, tx + rx)",
             f"{'preset':<22}{'step':<12}{'algorithm':>10}{'modeled_us':>12}{'busbw':>9}{'speed-up':>10}"
             f"{'gpu_link_B':>14}"]
    for preset in PRESETS:
        ran = algorithms(results[preset][1])
        for name, (_, ns, moved) in results[preset][0].items():
            busbw = f"{SIZE / ns * bus_factor(name, gpus):.1f}" if name in COLLECTIVES else "-"
            lines.append(f"{preset:<22}{name:<12}{ran.get(name, '-'):>10}{ns / 1e3:>12.3f}{busbw:>9}"
                         f"{results[first][0][name][1] / ns:>9.2f}x{moved:>14}")
    return "\n".join(lines)


def level_table(results: dict) -> str:
    """Payload bytes of each whole run per level, as the switches counted them (both directions)."""
    lines = ["# payload bytes of the whole run per level (the switches' counters, both directions)",
             f"{'preset':<22}{'gpu<->leaf':>14}{'leaf<->spine':>14}"]
    for preset in PRESETS:
        levels = level_bytes(results[preset][1])
        lines.append(f"{preset:<22}{levels['gpu-leaf']:>14}{levels['leaf-spine']:>14}")
    return "\n".join(lines)


def prediction_rows(collective: str) -> dict:
    """{preset: `collective` at BIG_NODES x BIG_PER_NODE by the cost model, algorithm auto (launch.model's
    row)}."""
    shape = argparse.Namespace(gpus=None, nodes=BIG_NODES, gpus_per_node=BIG_PER_NODE)
    return {preset: predict(collective, "auto", fabric_of(shape, preset), SIZE, "float32") for preset in PRESETS}


def prediction_table(rows: dict | None = None) -> str:
    """The two collectives at BIG_NODES x BIG_PER_NODE by the cost model, algorithm auto; rows: {collective:
    prediction_rows(collective)} if computed already."""
    rows = rows or {c: prediction_rows(c) for c in COLLECTIVES}
    rows = {(preset, c): rows[c][preset] for preset in PRESETS for c in COLLECTIVES}
    first = PRESETS[0]
    lines = [f"# PREDICTION by the cost model (fabric.cost_nodes replay; not emulated): {BIG_NODES} nodes x "
             f"{BIG_PER_NODE} GPUs = {BIG_NODES * BIG_PER_NODE} GPUs, 1 MiB per GPU, float32, algorithm auto",
             f"{'preset':<22}{'collective':<12}{'algorithm':>10}{'modeled_us':>12}{'busbw':>9}{'speed-up':>10}"]
    for preset in PRESETS:
        for c in COLLECTIVES:
            row, ref = rows[preset, c], rows[first, c]
            lines.append(f"{preset:<22}{c:<12}{row['algorithm']:>10}{row['modeled_us']:>12.3f}"
                         f"{row['busbw_gbps']:>9.1f}{ref['modeled_us'] / row['modeled_us']:>9.2f}x")
    return "\n".join(lines)


class Prediction:
    """prediction_table() computed in forked worker processes, one per collective, while the demo's jobs
    run (the replays at 256 GPUs take 15-22 s of CPU per collective; the jobs leave the cores idle much
    of the time)."""

    def __init__(self):
        self._pool = multiprocessing.get_context("fork").Pool(len(COLLECTIVES))
        self._rows = {c: self._pool.apply_async(prediction_rows, (c,)) for c in COLLECTIVES}

    def table(self, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        try:
            return prediction_table({c: rows.get(max(0.0, deadline - time.monotonic())) for c, rows in self._rows.items()})
        finally:
            self.close()

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()


def part4(args, launch_script, progress, script: str, prediction: Prediction) -> int:
    """Print part 4 (and draw its chart if args.plot); 0, or a CompareError from a failed run."""
    results = emulate(args, launch_script, progress, script)
    print(step_table(results, NODES * PER_NODE))
    print(level_table(results))
    print(prediction.table(), flush=True)
    if args.plot:
        plot_steps(args.plot, f"{NODES} nodes x {PER_NODE} GPUs: modeled time per step (emulated)",
                   list(PRESETS), {p: (results[p][0], None) for p in PRESETS})
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
