"""`nvlink-emu plan check|show FILE.xml|ALGORITHM`: validate a plan, print its per-link bytes and modeled
time on a fabric, or list its operations per GPU (fabric.plans)."""

import argparse
import sys

from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.plans import build, load, plan_link_bytes, plan_ns
from nvlink_emu.fabric.plans.registry import ALGORITHMS, grid
from nvlink_emu.fabric.plans.chunks import check_sizes
from nvlink_emu.fabric.topology import Topology

from ..options import fabric_of
from ..plotting import check_plot
from ..units import parse_size


def add_to(sub) -> None:
    """Add the `plan` command to the subparsers `sub`."""
    plan = sub.add_parser("plan", help="validate a collective plan (MSCCL-IR XML or a registry algorithm), print "
                          "its per-link bytes and modeled time; show: its operations per GPU")
    arguments(plan)
    plan.set_defaults(handler=cmd_plan)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("check", "show"), help="check: validate, print per-link bytes and "
                        "modeled time; show: also every GPU's operations in program order")
    parser.add_argument("plan", metavar="FILE.xml|ALGORITHM", help=f"an MSCCL-IR XML file, or a registry "
                        f"algorithm ({', '.join(ALGORITHMS)}) with --collective")
    parser.add_argument("--collective", default="allreduce", help="a registry algorithm's collective "
                        "(default allreduce)")
    parser.add_argument("-S", "--size", type=parse_size, default=16 << 20, metavar="B", help="bytes of the call "
                        "(bench's convention; default 16M)")
    parser.add_argument("--preset", help="named fabric (default: dgx-h100 sized to the plan)")
    parser.add_argument("--config", metavar="FILE.toml", help="fabric description in TOML")
    parser.add_argument("--gpus", type=int, help="GPUs of the fabric (default: the plan's)")
    parser.add_argument("--nodes", type=int, metavar="N", help="nodes of the fabric")
    parser.add_argument("--gpus-per-node", type=int, metavar="M", help="GPUs in each node")
    parser.add_argument("-o", "--output", metavar="FILE.png", help="show: draw the replayed call's timeline, per "
                        "GPU (where it waits) and per GPU link (each message's occupation, by peer), into this "
                        "image (.png, .svg or .pdf)")


ITEMSIZE = 4  # bytes of an element: the plans are built, checked and timed for float32 calls of -S bytes
IN_SWITCH = ("sharp", "nvls", "hier_nvls")  # built from the fabric's switch buffer and timed on its switches


def _plan(args):
    """(the plan the arguments name, the fabric it is checked on): an MSCCL-IR file's (the fabric sized to it
    unless the options size it), or a registry algorithm's, built for the fabric and a call of -S bytes (ring's
    channels, tree's and hier's pieces depend on it)."""
    if args.plan not in ALGORITHMS:
        plan = load(args.plan)
        if args.gpus is None and args.gpus_per_node is None:
            args.gpus = plan.gpus
        return plan, fabric_of(args)
    if args.gpus is None and args.gpus_per_node is None:
        raise FabricError(f"plan {args.plan!r}: give --gpus (or --nodes and --gpus-per-node)")
    if args.plan in IN_SWITCH:
        raise FabricError(f"plan {args.plan!r}: an in-switch plan is built from the fabric's switch buffer and timed "
                          f"on its switches: `nvlink-emu model {args.collective} --algorithm {args.plan}` gives its "
                          f"modeled time and link bytes")
    gpus = args.gpus if args.gpus is not None else args.nodes * args.gpus_per_node
    nodes = args.nodes or 1
    layout = grid(nodes, gpus // nodes) if gpus % nodes == 0 else None  # the grid of the GPUs across nodes
    config = fabric_of(args)
    chunk = max(1, config.chunk_bytes // ITEMSIZE)  # elements a message, as the replay cuts them
    return build(args.plan, gpus, args.collective, layout=layout, nbytes=args.size, itemsize=ITEMSIZE,
                 chunk_bytes=chunk * ITEMSIZE), config


def cmd_plan(args, script_args=None) -> int:
    try:
        if args.output is not None:
            if args.action != "show":
                raise FabricError("-o draws a timeline: it is for `plan show`")
            check_plot(args.output)
        plan, config = _plan(args)
        topo = config.topology if config.nodes > 1 else Topology.single(config)
        check_sizes(plan, args.size, ITEMSIZE)  # the elements at this size, as the ranks check them before they run it
        links = plan_link_bytes(plan, topo, args.size, config)
        events: list | None = [] if args.output is not None else None
        ns = plan_ns(plan, topo, args.size, config, events=events)
    except FabricError as exc:
        print(f"nvlink-emu: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    ops = sum(len(p.ops) for p in plan.programs)
    print(f"# plan {plan.name!r}: {plan.collective} on {plan.gpus} GPUs, {ops} operations, valid "
          f"(every output chunk holds exactly its contributions; no deadlock; buffers in range)")
    print(f"# fabric {config.name} ({config.mode} mode), {args.size} bytes: modeled {ns / 1000:.3f} us")
    print(f"{'link':<16}{'payload B':>14}{'raw B':>14}")
    for name in sorted(links):
        print(f"{name:<16}{links[name][0]:>14}{links[name][1]:>14}")
    if args.action == "show":
        for program in plan.programs:
            print(f"# GPU {program.gpu}: {program.i_chunks} input, {program.o_chunks} output, "
                  f"{program.s_chunks} scratch chunks")
            for step, op in enumerate(program.ops):
                parts = [f"{step:4d} ch{op.channel} {op.kind}"]
                if op.recv_from is not None:
                    parts.append(f"from GPU {op.recv_from}")
                if op.src is not None:
                    parts.append(f"src {op.src.buf}[{op.src.off}:{op.src.off + op.src.cnt}]")
                if op.dst is not None:
                    parts.append(f"dst {op.dst.buf}[{op.dst.off}:{op.dst.off + op.dst.cnt}]")
                if op.send_to is not None:
                    parts.append(f"to GPU {op.send_to}")
                if op.deps:
                    parts.append(f"after {', '.join(map(str, op.deps))}")
                print(" ".join(parts))
    if events is not None:
        draw_timeline(args.output, plan, config, topo, args.size, ns, events)
        print(f"wrote {args.output}")
    return 0


def draw_timeline(path: str, plan, config, topo, size: int, ns: float, events: list) -> None:
    """Draw a replayed call (fabric.plans.plan_ns's events) into the image `path`: one row per GPU with the
    spans its program waits (on a receive or a flush), and one row per GPU link, uplink and downlink, with
    every message's occupation of it coloured by the GPU at its other end; time in us."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = plan.gpus
    colours = plt.get_cmap("tab10" if n <= 10 else "tab20")
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(12, 2 + 0.35 * 3 * n),
                                      gridspec_kw={"height_ratios": (1, 2)})
    for g, what, peer, start, end in events:
        start, end = start / 1e3, end / 1e3
        if what == "wait":
            top.broken_barh([(start, end - start)], (g - 0.4, 0.8), color="tab:red" if peer is not None else "grey",
                            alpha=0.6)
        else:
            row = 2 * g + (what == "recv")
            bottom.broken_barh([(start, end - start)], (row - 0.4, 0.8), color=colours(peer % colours.N),
                               edgecolor="black", linewidth=0.2)
    top.axvline(ns / 1e3, color="black", linewidth=0.8)
    bottom.axvline(ns / 1e3, color="black", linewidth=0.8)
    top.set_yticks(range(n), [f"GPU {g}" for g in range(n)])
    top.set_ylim(n - 0.5, -0.5)
    top.set_title(f"plan {plan.name!r}: {plan.collective} on {n} GPUs of {config.name}, {size} bytes: "
                  f"{ns / 1e3:.3f} us (replayed)", fontsize="medium")
    top.legend(handles=[Patch(color="tab:red", alpha=0.6, label="waits for a message"),
                        Patch(color="grey", alpha=0.6, label="waits for its sends to leave (flush)")],
               loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    names = []
    for g in range(n):
        other = (g + 1) % n
        names += [topo.route(g, other)[0].name, topo.route(other, g)[-1].name] if n > 1 else [f"gpu{g} up", f"gpu{g} down"]
    bottom.set_yticks(range(2 * n), names)
    bottom.set_ylim(2 * n - 0.5, -0.5)
    bottom.set_xlabel("modeled time (us)")
    bottom.legend(handles=[Patch(color=colours(p % colours.N), label=f"to/from GPU {p}") for p in range(n)],
                  loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small", ncol=max(1, n // 16))
    bottom.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
