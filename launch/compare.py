"""`nvlink-emu run SCRIPT --compare P1,P2,...`: the workload once per preset, each its own job, then one
table of modeled step time, link bytes and time relative to the first preset, and a bar chart of the
step times. The script reports its steps in GPU 0's step lines (launch/workload.py)."""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path


from nvlink_emu.fabric.config import resolve
from nvlink_emu.fabric.errors import ConfigError

from .plotting import check_plot
from .project import ProjectionError, format_projection, mean_by_name, project_steps
from .options import fabric_of
from .workload import STEP_KEY, parse_step_line


class CompareError(Exception):
    """A --compare run that failed on one preset: `status` is the exit status to end with."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def compare_presets(text: str) -> list[str]:
    """The preset names of --compare P1,P2,...: two or more, each once; ConfigError otherwise (an
    unknown name is resolve's error, naming the known presets)."""
    presets = [name.strip() for name in text.split(",") if name.strip()]
    if len(presets) < 2:
        raise ConfigError(f"--compare {text}: takes two or more presets, P1,P2,...")
    repeated = sorted({name for name in presets if presets.count(name) > 1})
    if repeated:
        raise ConfigError(f"--compare {text}: names {', '.join(repeated)} more than once")
    return presets


def default_plot(script: str) -> str:
    """The bar chart's file when --plot is not given: SCRIPT's stem + '-compare.png', in the current directory."""
    return f"{Path(script).stem}-compare.png"


def run_link_bytes(report: dict) -> int:
    """Payload bytes over every link of a run, both directions (the report's switch counts)."""
    return sum(link["payload_bytes"] for link in report["links"].values())


def level_bytes(report: dict) -> dict[str, int]:
    """Payload bytes of a run per level, both directions (the report's switch counts): "gpu-leaf" (the
    links between GPUs and their switch: gpu3->sw0, sw0->gpu3) and "leaf-spine" (between switches)."""
    levels = {"gpu-leaf": 0, "leaf-spine": 0}
    for name, link in report["links"].items():
        levels["gpu-leaf" if "gpu" in name else "leaf-spine"] += link["payload_bytes"]
    return levels


def summarize(steps: list[dict]) -> dict:
    """{step name: (lines, mean step_ns, mean link_bytes or None)} of one run's step lines, in the order
    the names first came."""
    out = {}
    for name in dict.fromkeys(step["step"] for step in steps):
        mine = [step for step in steps if step["step"] == name]
        moved = [step["link_bytes"] for step in mine if step["link_bytes"] is not None]
        out[name] = (len(mine), sum(step["step_ns"] for step in mine) / len(mine),
                     round(sum(moved) / len(moved)) if len(moved) == len(mine) else None)
    return out


def run_compare(args, script_args, launch_script, progress) -> int:
    """Each preset of args.compare in turn (each a job of launch_script, quiet), then the table on
    stdout and the chart. The workload's own lines go to stderr, each after its preset's name."""
    presets = compare_presets(args.compare)
    if args.preset or args.config:
        raise ConfigError("--compare takes the presets, P1,P2,..., instead of --preset/--config")
    if args.report_json is not None:
        raise ConfigError("--report-json: one report per run, and --compare makes a run per preset")
    if args.no_label:
        raise ConfigError("--no-label: --compare reads GPU 0's step lines by their [gpu 0] label")
    configs = {name: fabric_of(args, name) for name in presets}  # every name checked before any job
    targets = projection_targets(args, configs)
    plot = args.plot or default_plot(args.script)
    check_plot(plot)
    if not Path(args.script).is_file():
        raise ConfigError(f"{args.script}: no such script")
    runs = run_each(args, script_args, launch_script, progress, configs, with_lines=targets is not None)
    results = {name: (run[0], run_link_bytes(run[1])) for name, run in runs.items()}
    names = list(results[presets[0]][0])
    for name in presets[1:]:
        if list(results[name][0]) != names:
            raise CompareError(f"{args.script}: its steps differ between presets: {presets[0]} printed "
                               f"{_names(names)}, {name} printed {_names(list(results[name][0]))}")
    print(format_table(args.script, next(iter(configs.values())).gpus, presets, results), flush=True)
    plot_steps(plot, f"{Path(args.script).name} on {next(iter(configs.values())).gpus} GPUs: modeled step time",
               presets, results)
    print(f"wrote {plot}", file=sys.stderr)
    if targets is not None:
        first = configs[presets[0]]
        for name in presets:  # a call past GPU 0's records would pass for compute
            if runs[name][1].get("collectives_unrecorded", {}).get("0"):
                raise CompareError(f"{args.script}: --project-nodes: on {name} GPU 0 made more collective calls "
                                   f"than its report records; time fewer steps")
        try:
            means = {name: mean_by_name(project_steps(runs[name][2], runs[name][1]["collectives"], targets[name],
                                                      configs[name].gpus)) for name in presets}
        except ProjectionError as exc:
            raise CompareError(f"{args.script}: --project-nodes: {exc}") from None
        target = targets[presets[0]]
        print(format_projection(Path(args.script).name, presets, means,
                                (f"{first.nodes} x {first.gpus_per_node} GPUs",
                                 f"{target.nodes} x {target.gpus_per_node} GPUs")), flush=True)
    return 0


def projection_targets(args, configs: dict) -> dict | None:
    """{preset: its fabric at --project-nodes nodes of the same GPUs per node and --software}, or None
    without --project-nodes. ConfigError before any job for a count or a shape the presets cannot take."""
    nodes = getattr(args, "project_nodes", None)
    if nodes is None:
        return None
    if nodes < 1:
        raise ConfigError(f"--project-nodes: must be a positive integer, got {nodes}")
    if getattr(args, "faults", None):
        raise ConfigError("--project-nodes: the cost model has no faults; run without --faults")
    try:
        return {name: resolve(name, None, None, nodes, config.gpus_per_node, getattr(args, "software", None))
                for name, config in configs.items()}
    except ConfigError as exc:
        raise ConfigError(f"--project-nodes {nodes}: {exc}") from None


def run_each(args, script_args, launch_script, progress, configs: dict, with_lines: bool = False) -> dict:
    """Run args.script once per preset of `configs` ({name: config}), each a quiet job with its own
    report: {name: (summarize(its step lines), its run report as a dict)}, with_lines: and its parsed step
    lines, a third item. CompareError if a run fails, prints a malformed step line or none."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="nvlink-emu-compare-") as workdir:
        for name, config in configs.items():
            report = Path(workdir) / f"{name}.json"
            per_preset = argparse.Namespace(**{**vars(args), "preset": name, "config": None,
                                               "report_json": str(report),
                                               "trace_dir": str(Path(args.trace_dir) / name) if args.trace_dir else None})
            steps: list = []
            bad: list = []

            def on_line(line: str, steps=steps, bad=bad, name=name) -> None:
                print(f"[{name}] {line}", file=sys.stderr, flush=True)
                try:
                    step = parse_step_line(line)
                except ValueError as exc:
                    bad.append(str(exc))
                    return
                if step is not None:
                    steps.append(step)

            status = launch_script(args.script, per_preset, script_args, config.world_size, on_line, quiet=True)
            if status:
                raise CompareError(f"{args.script} failed on preset {name} (exit status {status}); its output "
                                   f"is above, after [{name}]", status)
            if bad:
                raise CompareError(f"{args.script} on preset {name}: GPU 0 printed a malformed step line: {bad[0]}")
            if not steps:
                raise CompareError(f"{args.script} printed no step time on preset {name}: GPU 0 must print a line "
                                   f"{STEP_KEY}=<float> (nvlink_emu.launch.workload.timed_step prints it)")
            results[name] = (summarize(steps), json.loads(report.read_text())) + ((steps,) if with_lines else ())
            progress.step(f"{name} done")
    return results


def _names(names: list) -> str:
    return ", ".join("(unnamed)" if n is None else n for n in names)


def format_table(script: str, gpus: int, presets: list[str], results: dict) -> str:
    """The comparison: a row per preset and step name: steps timed, mean modeled step time (us), the
    ratio to the first preset's (same step), link bytes per step (from the step lines) and of the whole
    run (the run's report: every GPU link, both directions)."""
    first = presets[0]
    ratio_head = f"x{first}"
    width = max(len(p) for p in presets) + 2
    step_width = max([len(n) for n in results[first][0] if n] + [4]) + 2
    lines = [f"# {Path(script).name} on {gpus} GPUs: modeled step time per preset (the slowest GPU's, mean over the "
             f"steps timed); {ratio_head} = step time / {first}'s; link bytes: payload over every GPU link, both "
             f"directions",
             f"{'preset':<{width}}{'step':<{step_width}}{'steps':>6}{'step_us':>14}{ratio_head:>{max(12, len(ratio_head) + 2)}}"
             f"{'link_B/step':>16}{'link_B/run':>16}"]
    for preset in presets:
        steps, run_bytes = results[preset]
        for name, (count, ns, moved) in steps.items():
            ref = results[first][0][name][1]
            ratio = f"{ns / ref:.2f}" if ref else "n/a"
            lines.append(f"{preset:<{width}}{name or '-':<{step_width}}{count:>6}{ns / 1e3:>14.3f}"
                         f"{ratio:>{max(12, len(ratio_head) + 2)}}{'n/a' if moved is None else moved:>16}{run_bytes:>16}")
    return "\n".join(lines)


def plot_steps(path: str, title: str, presets: list[str], results: dict) -> None:
    """A bar chart of the mean modeled step time (us) per preset, a bar per step name side by side,
    each bar labelled with its time; into `path` (PNG, or another format matplotlib writes by suffix)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    names = list(results[presets[0]][0])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(presets) * max(1, len(names)) ** 0.5), 4.8))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [p + (i - (len(names) - 1) / 2) * width for p in range(len(presets))]
        heights = [results[preset][0][name][1] / 1e3 for preset in presets]
        bars = ax.bar(xs, heights, width, label=name or "step")
        ax.bar_label(bars, labels=[_short(h) for h in heights], fontsize=8, padding=2)
    ax.set_xticks(range(len(presets)), presets)
    ax.set_ylabel("modeled step time (us)")
    ax.set_title(title)
    if len(names) > 1:
        ax.legend()
    ax.margins(y=0.15)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _short(us: float) -> str:
    return f"{us:.3g}" if us < 1000 or not math.isfinite(us) else f"{us:,.0f}"
