"""A timed workload projected to a larger fabric by the cost model, from an emulated run's own calls
(`nvlink-emu run SCRIPT --compare P1,P2,... --project-nodes N`).

The rule, per step line of GPU 0 (launch/workload.py: step_ns, start_ns):
- the step's calls: GPU 0's collective call records (the run report's "collectives") that start in
  [start_ns, start_ns + step_ns). They must be blocking: a call overlapping compute would be counted
  twice (assumption: the script calls them blocking, as dlrm.py does; not checked).
- compute_ns = step_ns - the sum of those calls' modeled time (m_end_ns - m_start_ns on GPU 0). It keeps
  everything that is not GPU 0's calls: its kernels and its wait for the slowest GPU at the step's end.
  Weak scaling: the same samples per GPU, so compute_ns is kept as is at the larger shape.
- each call re-timed at the larger shape: fabric.cost_nodes.modeled_ns (links + NCCL's software latency)
  of the same collective on the same bytes per GPU (GPU 0's), by the algorithm `auto` picks there
  (fabric.tuner.choose; fabric.tuner.all2all_algorithm for all2all). An all2allv is timed as an
  all2all of GPU 0's send bytes in equal blocks (the cost model's all2allv needs every GPU's counts,
  which a larger run would choose itself). An all2all's bytes are rounded up to whole equal blocks of
  whole elements (a multiple of gpus x itemsize: the cost model's all2all requires it), e.g. an all2all
  of one count per peer keeps one count per peer.
- projected step = compute_ns + the re-timed calls; communication share = calls / step.
Calls on a communicator of some of the GPUs, and collectives other than PROJECTED, are a ProjectionError:
what their larger counterparts would be is the script's choice, not the model's.
"""

import math
from dataclasses import dataclass

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.reduction import dtype_itemsize
from nvlink_emu.fabric.tuner import all2all_algorithm, choose

PROJECTED = ("allreduce", "all2all", "all2allv")  # the collectives a projection re-times


class ProjectionError(Exception):
    """A run the projection cannot re-time: the message names the step and the call."""


@dataclass(frozen=True)
class ProjectedCall:
    collective: str     # as GPU 0 called it (all2allv too)
    nbytes: int         # bytes per GPU at the larger shape (an all2all's rounded up to whole blocks)
    algorithm: str      # auto's pick at the larger shape
    emulated_ns: float  # GPU 0's m_end_ns - m_start_ns in the run
    projected_ns: float  # cost_nodes.modeled_ns at the larger shape


@dataclass(frozen=True)
class ProjectedStep:
    name: str | None
    step_ns: float      # the emulated step (the step line's)
    compute_ns: float   # step_ns - GPU 0's calls in it: kept at the larger shape
    calls: tuple        # ProjectedCall, in GPU 0's order

    @property
    def comm_ns(self) -> float:
        """GPU 0's calls in the emulated step (ns)."""
        return sum(call.emulated_ns for call in self.calls)

    @property
    def projected_comm_ns(self) -> float:
        return sum(call.projected_ns for call in self.calls)

    @property
    def projected_ns(self) -> float:
        return self.compute_ns + self.projected_comm_ns


def step_calls(step: dict, records: list[dict]) -> list[dict]:
    """GPU 0's call records (report["collectives"] rows) that start inside `step` (a parsed step line with
    start_ns), in the order GPU 0 made them. ProjectionError if the line has no start_ns."""
    start = step.get("start_ns")
    if start is None:
        raise ProjectionError(f"step {step.get('step') or '(unnamed)'}: its step line has no start_ns (time it with "
                              f"nvlink_emu.launch.workload.timed_step, which prints it)")
    end = start + step["step_ns"]
    return [r for r in records if r["gpu"] == 0 and start <= r["m_start_ns"] < end]


def project_call(record: dict, config, emulated_gpus: int) -> ProjectedCall:
    """GPU 0's call `record` re-timed on `config` (the larger fabric), as the module says."""
    collective = record["collective"]
    if collective not in PROJECTED:
        raise ProjectionError(f"GPU 0's {collective} call {record['seq']} on {record['comm']}: the projection "
                              f"re-times {', '.join(PROJECTED)} only")
    if record["members"] != emulated_gpus:
        raise ProjectionError(f"GPU 0's {collective} call {record['seq']} on {record['comm']}: {record['members']} "
                              f"of the run's {emulated_gpus} GPUs; the projection re-times calls of every GPU only")
    itemsize = dtype_itemsize(record["dtype"])
    nbytes = record["count"] * itemsize
    emulated_ns = record["m_end_ns"] - record["m_start_ns"]
    if nbytes == 0:
        return ProjectedCall(collective, 0, record["algorithm"], emulated_ns, 0.0)  # NCCL returns at once
    topo = config.topology
    if collective == "allreduce":
        algorithm = choose("allreduce", "auto", config, nbytes)
        return ProjectedCall(collective, nbytes, algorithm, emulated_ns,
                             cost_nodes.modeled_ns("allreduce", algorithm, topo, nbytes, config, itemsize))
    block = config.gpus * itemsize  # all2all, all2allv: equal blocks of whole elements
    nbytes = math.ceil(nbytes / block) * block
    algorithm = all2all_algorithm("auto", config, nbytes, itemsize=itemsize)
    return ProjectedCall(collective, nbytes, algorithm, emulated_ns,
                         cost_nodes.modeled_ns("all2all", algorithm, topo, nbytes, config, itemsize))


def project_steps(steps: list[dict], records: list[dict], config, emulated_gpus: int) -> list[ProjectedStep]:
    """Each of GPU 0's step lines (parsed, with start_ns) of a run on `emulated_gpus` GPUs, with its calls
    (`records`: the run report's "collectives") re-timed on `config`, the larger fabric."""
    projected = []
    for step in steps:
        calls = tuple(project_call(r, config, emulated_gpus) for r in step_calls(step, records))
        projected.append(ProjectedStep(step["step"], step["step_ns"],
                                       step["step_ns"] - sum(c.emulated_ns for c in calls), calls))
    return projected


def mean_by_name(projected: list[ProjectedStep]) -> dict:
    """{step name: (emulated step ns, emulated comm ns, projected step ns, projected comm ns)}, each the
    mean over the steps of that name, names in the order they first came."""
    out = {}
    for name in dict.fromkeys(p.name for p in projected):
        mine = [p for p in projected if p.name == name]
        out[name] = tuple(sum(f(p) for p in mine) / len(mine) for f in (
            lambda p: p.step_ns, lambda p: p.comm_ns, lambda p: p.projected_ns, lambda p: p.projected_comm_ns))
    return out


def format_projection(script: str, presets: list[str], means: dict, shapes: tuple[str, str]) -> str:
    """Two tables, emulated at shapes[0] and projected at shapes[1]: per preset and step name the step
    time (us), speed-up = the first preset's step time / this one's, communication (us) and its share of
    the step. `means`: {preset: mean_by_name(...)}."""
    first = presets[0]
    width = max(len(p) for p in [*presets, "preset"]) + 2
    step_width = max([len(n) for n in means[first] if n] + [4]) + 2
    lines = []
    for which, (shape, title) in enumerate(zip(shapes, ("emulated", "projected by the cost model"))):
        lines += [f"# {script}, {title}, {shape}: step time (us; the slowest GPU's, mean over the steps), "
                  f"speed-up = {first}'s step time / this one's, comm = GPU 0's collective calls (us) and their "
                  f"share of the step" + ("" if which == 0 else "; compute kept from the emulated step (weak "
                                          "scaling), each call re-timed by fabric.cost_nodes.modeled_ns"),
                  f"{'preset':<{width}}{'step':<{step_width}}{'step_us':>12}{'speed-up':>10}{'comm_us':>12}"
                  f"{'comm_share':>12}"]
        for preset in presets:
            for name, row in means[preset].items():
                step_ns, comm_ns = row[2 * which], row[2 * which + 1]
                ref = means[first][name][2 * which]
                lines.append(f"{preset:<{width}}{name or '-':<{step_width}}{step_ns / 1e3:>12.3f}"
                             f"{(ref / step_ns if step_ns else math.nan):>10.2f}{comm_ns / 1e3:>12.3f}"
                             f"{(comm_ns / step_ns if step_ns else math.nan):>12.2f}")
    return "\n".join(lines)
