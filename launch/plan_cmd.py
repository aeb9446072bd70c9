"""`nvlink-emu plan check|show FILE.xml|ALGORITHM`: validate a plan, print its per-link bytes and modeled
time on a fabric, or list its operations per GPU (fabric.plans)."""

import argparse
import sys

from nvlink_emu.fabric.errors import FabricError
from nvlink_emu.fabric.plans import build, load, plan_link_bytes, plan_ns
from nvlink_emu.fabric.plans.registry import ALGORITHMS
from nvlink_emu.fabric.topology import Topology

from .bench import _size
from .runner import fabric_of


def plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("check", "show"), help="check: validate, print per-link bytes and "
                        "modeled time; show: also every GPU's operations in program order")
    parser.add_argument("plan", metavar="FILE.xml|ALGORITHM", help=f"an MSCCL-IR XML file, or a registry "
                        f"algorithm ({', '.join(ALGORITHMS)}) with --collective")
    parser.add_argument("--collective", default="allreduce", help="a registry algorithm's collective "
                        "(default allreduce)")
    parser.add_argument("-S", "--size", type=_size, default=16 << 20, metavar="B", help="bytes of the call "
                        "(bench's convention; default 16M)")
    parser.add_argument("--preset", help="named fabric (default: dgx-h100 sized to the plan)")
    parser.add_argument("--config", metavar="FILE.toml", help="fabric description in TOML")
    parser.add_argument("--gpus", type=int, help="GPUs of the fabric (default: the plan's)")
    parser.add_argument("--nodes", type=int, metavar="N", help="nodes of the fabric")
    parser.add_argument("--gpus-per-node", type=int, metavar="M", help="GPUs in each node")


def _plan(args):
    if args.plan in ALGORITHMS:
        if args.gpus is None and args.gpus_per_node is None:
            raise FabricError(f"plan {args.plan!r}: give --gpus (or --nodes and --gpus-per-node)")
        gpus = args.gpus if args.gpus is not None else args.nodes * args.gpus_per_node
        return build(args.plan, gpus, args.collective)
    return load(args.plan)


def cmd_plan(args, script_args=None) -> int:
    try:
        plan = _plan(args)
        if args.gpus is None and args.gpus_per_node is None:
            args.gpus = plan.gpus
        config = fabric_of(args)
        topo = config.topology if config.nodes > 1 else Topology.single(config)
        links = plan_link_bytes(plan, topo, args.size, config)
        ns = plan_ns(plan, topo, args.size, config)
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
    return 0
