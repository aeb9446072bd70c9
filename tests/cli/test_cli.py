"""CLI tier: `nvlink-emu run`, `nvlink-emu demo` and `python -m nvlink_emu.launch` as subprocesses under mpiexec."""

import os
import shutil
import sys
import tempfile
import textwrap
import tomllib
from pathlib import Path

import pytest

from cli_helpers import BIN, ROOT, command, heavy_result, run, script
from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.config import resolve
from nvlink_emu.launch.superpod_demo import NODES, PER_NODE, PRESETS as SUPERPODS
from nvlink_emu.ranks.collectives import allowed, choose

PUT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np

    def main(gpu):
        size = int(sys.argv[1])
        window = gpu.alloc(size, "uint8")
        handle = gpu.world.allgather_object(gpu.export(window))[1]
        if gpu.rank == 0:
            gpu.put(handle, np.full(size, 3, np.uint8))
            gpu.fence()
        gpu.world.barrier()
        if gpu.rank == 1:
            assert (window == 3).all()
""")


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_run_prints_one_link_table_with_exact_bytes(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, PUT_SCRIPT), "--gpus", "3", "--", "5000"])
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stderr.splitlines() if "<->sw0" in line}
    # 5000 B in 256 B packets: 20 packets, raw = 5000 + 20 x 16
    assert rows["gpu0<->sw0"][:3] == ["5000", "5320", "20"]
    assert rows["gpu1<->sw0"][3:6] == ["5000", "5320", "20"]
    assert done.stderr.count("# per-link counters") == 1
    assert done.stdout == ""  # the tool's table stays out of the workload's output


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_messages_left_unreceived_on_mpi_comm_world_are_dropped_and_said_not_a_status_9(tmp_path):
    """Issue 25 (status 9): GPU 0 sends GPU 1 raw messages on the real MPI_COMM_WORLD as its last act,
    which nobody receives. MPICH's MPI_Finalize failed on GPU 1 ("... being freed has N unmatched
    message(s)") and mpiexec killed the other ranks: the run completed, the job ended with status 9 and
    "Killed (signal 9)". The end of the run sweeps them now, and the receiving rank says so."""
    body = textwrap.dedent("""
        import numpy as np
        from mpi4py import MPI  # the real one: the workload reaches around the fabric

        def main(gpu):
            gpu.world.barrier()
            if gpu.rank == 0:
                junk = np.zeros(64, np.uint8)
                sends = [MPI.COMM_WORLD.Isend([junk, MPI.BYTE], 1, 7) for _ in range(300)]
                MPI.Request.Waitall(sends)
    """)
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3", "--timeout", "60"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "signal 9" not in done.stderr and "# per-link counters" in done.stderr
    # GPU 1's sweeps during the run may have taken some or all of them (counted in its gpu.strays); the
    # label is the launcher's (launch/labels.py): GPU 1's rank wrote the line
    said = [line for line in done.stderr.splitlines() if "around the fabric" in line]
    assert len(said) <= 1 and all(line.startswith("[gpu 1] nvlink-emu: rank 1 (gpu 1): dropped ") for line in said), said
    assert all(0 < int(line.split("dropped ")[1].split()[0]) <= 300 for line in said)


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_send_held_past_the_receiver_s_mailbox_bound_times_out_naming_it(tmp_path):
    """Issue 25.8: a receiver keeps at most MAILBOX_PEER_BYTES of a sender's messages its program has not
    taken; a sender that waits for more to leave waits until the run's deadline, which says why."""
    body = textwrap.dedent("""
        import numpy as np

        def main(gpu):
            if gpu.rank == 0:
                sends = [gpu.send_message(1, ("left", i), np.zeros(1 << 20, np.uint8)) for i in range(40)]
                gpu.wait_sent(sends, "the sends")
    """)
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "2", "--timeout", "3"])
    assert done.returncode == 1
    assert ("FabricTimeout: GPU 0: the sends timed out after 3 s waiting for the switch to take the data (a message "
            "waits there while its receiver, a GPU of this node, has 1024 of this GPU's messages or 32 MiB of them "
            "not taken by its program)") in done.stderr, done.stderr[-2000:]


DEMO: dict[str, Path] = {}  # "plot": the PNG the heavy demo job draws


def demo_command() -> list[str]:
    DEMO["plot"] = Path(tempfile.mkdtemp(prefix="nvlink-emu-demo-")) / "superpods.png"
    return [command("nvlink-emu"), "demo", "--plot", str(DEMO["plot"])]


def heavy_jobs(items) -> dict:
    """The demo for tests/cli/conftest.py's lanes, first in lane 1: a whole demo is ~120 s of CPU on 2
    cores (its jobs and part 4's prediction), which the lanes overlap with the quick tests instead of
    running it alone among them. First: this file's test waits for it, early in the quick tests' order
    (last, the quick tests stopped here until the whole lane had run: 625 s against 592 for the suite)."""
    return {1: [(item.nodeid, demo_command, -1)
                for item in items if item.originalname == "test_demo_shows_isolation_and_classic_nvlink"]}


@pytest.mark.slow  # the whole demo, four parts
def test_demo_shows_isolation_and_classic_nvlink(request):
    done, elapsed = heavy_result(request.node.nodeid)
    request.addfinalizer(lambda: shutil.rmtree(DEMO["plot"].parent, ignore_errors=True))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "refused: AccessViolation" in out and "isolation holds" in out
    assert "landed" in out and "OVERWRITTEN" in out
    assert "refused after revoke" in out and "fixed at boot" in out
    assert out.count("OutOfMemory") == 2
    assert done.stderr.count("# per-link counters") == 2 and "# per-link counters" not in out
    # 8 GPUs, 4 MiB: ring and direct move 2(N-1)/N x S, sharp S, nvls (N+1)/N x S per GPU each way
    table = {line.split()[0]: line.split() for line in out.splitlines() if "every GPU holds the average" in line}
    assert table["ring"][1:4] == ["7340032", "7340032", "1.750"]
    assert table["sharp"][1:4] == ["4194304", "4194304", "1.000"]
    assert table["nvls"][1:4] == ["4718592", "4718592", "1.125"]
    assert float(table["sharp"][4]) < float(table["ring"][4])  # modeled us
    assert out.count("UnsupportedOperation: fabric 'dgx-a100' has no in-switch reduction") == 2
    assert out.count("every GPU got exactly the rows it asked for") == 2
    # part 3: one AllReduce sweep on three presets side by side, modeled
    assert "=== part 3" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("16777216"))
    assert row[1::4][:3] == ["direct", "sharp", "direct"] and row[-1] == "0"  # auto: the cost model's fastest
    assert float(row[6]) < float(row[2]) < float(row[10])  # dgx-h100 < dgx-a100 < h100-ib
    # progress while part 3 runs, and none of its jobs' link tables (the comparison is their result)
    assert "nvlink-emu: bench allreduce: 9/9 h100-ib: 16 MiB done" in done.stderr
    # part 4, emulated at 2 x 4: each collective's GPU-link bytes are the closed form of the algorithm
    # auto ran (fabric.cost_nodes.link_bytes), and the switches' GPU-link totals are the steps' sum
    part4 = out[out.index("=== part 4"):]
    steps = {(r[0], r[1]): r for r in (line.split() for line in part4.splitlines())
             if len(r) == 7 and r[0] in SUPERPODS}
    assert len(steps) == 9, part4
    for name in SUPERPODS:
        config = resolve(name, None, None, 2, 4)
        for collective in ("all2all", "allreduce"):
            links = cost_nodes.link_bytes(collective, steps[name, collective][2], config.topology, 1 << 20, 4,
                                          config=config)
            assert int(steps[name, collective][6]) == sum(b for link, b in links.items() if "gpu" in link)
        levels = next(line.split() for line in part4.splitlines()
                      if line.startswith(name) and len(line.split()) == 3)
        assert int(levels[1]) == sum(int(steps[name, step][6]) for step in ("all2all", "allreduce", "dlrm-step"))
        assert int(levels[2]) > 0  # leaf<->spine
    # the spines reduce, so sharp is a candidate across nodes; at 1 MiB a GPU auto weighs it with NCCL's software
    # latency (NVLS: 25 us, fabric.software) against direct's
    nvlink = resolve("superpod-h100-nvlink", None, None, NODES, PER_NODE)
    assert "sharp" in allowed(nvlink, NODES, "allreduce")
    assert steps["superpod-h100-nvlink", "allreduce"][2] == choose("allreduce", "auto", nvlink, 1 << 20)
    for step in ("all2all", "allreduce", "dlrm-step"):  # the NVLink Network beats both InfiniBand SuperPODs
        assert float(steps["superpod-h100-nvlink", step][3]) < float(steps["superpod-h100-ib", step][3]) \
            < float(steps["superpod-a100-ib", step][3])
    predicted = part4[part4.index("# PREDICTION"):]
    assert "32 nodes x 8 GPUs = 256 GPUs" in predicted
    assert len([line for line in predicted.splitlines() if line.split()[0] in SUPERPODS]) == 6
    assert DEMO["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_raising_gpu_ends_the_job_with_its_traceback(tmp_path):
    body = textwrap.dedent("""
        def main(gpu):
            if gpu.rank == 2:
                raise RuntimeError("boom on purpose")
            gpu.world.barrier()
    """)
    done, elapsed = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3", "--timeout", "60"])
    assert done.returncode != 0
    assert "[nvlink-emu gpu 2]" in done.stderr and done.stderr.count("RuntimeError: boom on purpose") == 1
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end; it must not wait for the 60 s deadline"


def test_a_script_failing_to_load_on_one_rank_only_ends_the_job(tmp_path):
    # the other ranks must not wait forever in the fabric's setup for the one that failed
    body = textwrap.dedent("""
        import os
        if os.environ.get("PMI_RANK") == "1":
            raise RuntimeError("import fails on rank 1 only")
        def main(gpu):
            gpu.world.barrier()
    """)
    done, elapsed = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "2", "--timeout", "60"])
    assert done.returncode != 0
    assert "[nvlink-emu rank 1]" in done.stderr and "RuntimeError: import fails on rank 1 only" in done.stderr
    assert elapsed < 30


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_a_gpu_that_never_arrives_ends_the_job_at_the_deadline(tmp_path):
    body = textwrap.dedent("""
        def main(gpu):
            if gpu.rank != 1:
                gpu.world.barrier()
    """)
    done, elapsed = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "3", "--timeout", "2"])
    assert done.returncode != 0
    assert "FabricTimeout: GPU 0: barrier" in done.stderr or "FabricTimeout: GPU 2: barrier" in done.stderr
    assert "waiting for GPUs [1]" in done.stderr
    assert elapsed < 30


def test_world_size_that_does_not_match_the_fabric_is_refused_before_traffic(tmp_path):
    done, _ = run([command("mpiexec"), "-n", "3", sys.executable, "-m", "nvlink_emu.launch",
                   script(tmp_path, PUT_SCRIPT), "--preset", "dgx-h100"])
    assert done.returncode != 0
    assert "world size 3 does not match fabric 'dgx-h100'" in done.stderr
    assert "mpiexec -n 9" in done.stderr and done.stderr.count("nvlink-emu: error") == 1


def test_a_world_size_that_does_not_match_several_nodes_names_the_one_they_need(tmp_path):
    done, _ = run([command("mpiexec"), "-n", "5", sys.executable, "-m", "nvlink_emu.launch",
                   script(tmp_path, PUT_SCRIPT), "--preset", "superpod-h100-ib", "--nodes", "3", "--gpus-per-node", "2"])
    assert done.returncode != 0 and done.stderr.count("nvlink-emu: error") == 1
    # 3 nodes of 2 GPUs, a leaf each, and a spine per local index: 3 x 3 + 2
    assert ("world size 5 does not match fabric 'superpod-h100-ib': 3 nodes x 2 GPUs + 3 leaf switches + 2 spines = "
            "11 ranks; run with mpiexec -n 11") in done.stderr


def test_unknown_config_key_is_an_error_naming_it(tmp_path):
    config = tmp_path / "fabric.toml"
    config.write_text('base = "dgx-h100"\ngpus = 3\nbandwidth = 3\n')
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, PUT_SCRIPT), "--config", str(config)])
    assert done.returncode == 2
    assert "unknown key(s) bandwidth" in done.stderr


def test_config_file_with_partitions_runs(tmp_path):
    config = tmp_path / "fabric.toml"
    config.write_text('base = "dgx-h100"\ngpus = 4\npartitions = [[0, 1], [2, 3]]\n')
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, PUT_SCRIPT), "--config", str(config),
                   "--", "64"])
    assert done.returncode == 0, done.stderr
    assert "# fabric fabric (network mode, 4 GPUs + 1 switch)" in done.stderr


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100"])
def test_the_readme_example_runs_on_both_kinds_of_nvlink(preset):
    example = str(ROOT / "launch" / "examples" / "put_ring.py")
    done, _ = run([command("nvlink-emu"), "run", example, "--gpus", "3", "--preset", preset])
    assert done.returncode == 0, done.stderr[-3000:]
    table = {line.split()[0]: line.split() for line in done.stderr.splitlines() if line.startswith("gpu")}
    assert [table[f"gpu{g}<->sw0"][1] for g in range(3)] == [str(1 << 20)] * 3  # 1 MiB out of every GPU


def test_version_and_help_name_every_option():
    done, _ = run([command("nvlink-emu"), "--version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert done.returncode == 0 and done.stdout == f"nvlink-emu {version}\n"
    top, _ = run([command("nvlink-emu"), "--help"])
    assert "NVLINK_EMU_MPIEXEC" in top.stdout
    helped, _ = run([command("nvlink-emu"), "run", "--help"])
    assert "[-- ARGS ...]" in helped.stdout and "sys.argv[1:]" in helped.stdout
    bench, _ = run([command("nvlink-emu"), "bench", "--help"])
    text = " ".join(bench.stdout.split())
    for option in ("COLLECTIVE the collective to sweep", "--algorithm A auto", "-b B, --min-bytes B smallest",
                   "-e B, --max-bytes B largest", "-f F, --factor F", "--dtype D element type", "--op OP reduction",
                   "-n N, --iters N", "--plot FILE.png draw busbw", "NVLINK_EMU_MPIEXEC"):
        assert option in text, option


@pytest.mark.parametrize("command_line", [["demo", "--", "x"], ["trace", "dir", "--", "x"]])
def test_arguments_after_dashes_are_for_run_only(command_line):
    done, _ = run([command("nvlink-emu"), *command_line])
    assert done.returncode == 2
    assert done.stderr.startswith(f"nvlink-emu: error: {command_line[0]} takes no arguments after --, got 'x'")


def test_a_syntax_error_in_a_workload_shows_its_own_frames(tmp_path):
    broken = script(tmp_path, "import os\n\ndef main(gpu)\n    pass\n", "broken.py")
    done, _ = run([command("nvlink-emu"), "run", broken, "--gpus", "2"])
    assert done.returncode == 1
    # GPU 0's lines (every GPU loads the script, GPU 0 speaks for all), labelled as the MPI launcher told it
    assert done.stderr.splitlines() == [f'[gpu 0]   File "{broken}", line 3', "[gpu 0]     def main(gpu)",
                                        "[gpu 0]                  ^", "[gpu 0] SyntaxError: expected ':'"]
    raising = script(tmp_path, "def helper():\n    raise RuntimeError('at import')\n\nhelper()\n", "raising.py")
    done, _ = run([command("nvlink-emu"), "run", raising, "--gpus", "2"])
    assert done.returncode == 1
    assert done.stderr.startswith(f'[gpu 0] Traceback (most recent call last):\n[gpu 0]   File "{raising}", '
                                  f'line 4, in <module>')
    assert "runner.py" not in done.stderr and "runpy" not in done.stderr
    assert done.stderr.rstrip().endswith("RuntimeError: at import")


def test_the_partitions_example_keeps_tenants_apart():
    done, _ = run([command("nvlink-emu"), "run", str(ROOT / "launch" / "examples" / "partitions.py"),
                   "--config", str(ROOT / "launch" / "examples" / "partitioned.toml")])
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "1. partition [0, 1]: AllReduce sum of (GPU + 1) = 3, AllGather of GPU indices = [0, 1]: its own" in out
    assert "1. partition [2, 3]: AllReduce sum of (GPU + 1) = 7, AllGather of GPU indices = [2, 3]: its own" in out
    assert "with its handle: AccessViolation: GPU 2: put to window" in out and "GPU 2 is in partition 1" in out
    assert "its get of the same window: AccessViolation" in out and "window bytes unchanged" in out
    assert "exports a window to GPU 2: AccessViolation" in out and "isolation holds" in out
    ports = {line.split()[0]: line.split() for line in done.stderr.splitlines() if "<->sw0" in line}
    assert ports["gpu2<->sw0"][-1] == "2"  # violations: its put and its get


def test_the_slurm_script_says_how_to_use_it(tmp_path):
    slurm = str(ROOT / "launch" / "examples" / "slurm.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done, _ = run(["bash", slurm], env=env)
    assert done.returncode == 2 and done.stderr.startswith("usage: sbatch launch/examples/slurm.sh SCRIPT.py")
    done, _ = run(["bash", slurm, "launch/examples/put_ring.py"], env=env)
    assert done.returncode == 2 and "SLURM_NTASKS is not set" in done.stderr
    # under Slurm, submitted from a directory with .venv: a stand-in srun starts the ranks with mpiexec
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "activate").write_text(f'export PATH="{BIN}{os.pathsep}$PATH"\n')  # this test's venv
    (venv_bin / "srun").write_text(f'#!/bin/sh\n[ "$1" = -n ] || exit 9\nexec {command("mpiexec")} "$@"\n')
    (venv_bin / "srun").chmod(0o755)
    env.update(SLURM_NTASKS="4", PATH=f"{venv_bin}{os.pathsep}{env['PATH']}")
    done, _ = run(["bash", slurm, str(ROOT / "launch" / "examples" / "put_ring.py")], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    table = {line.split()[0]: line.split() for line in done.stderr.splitlines() if line.startswith("gpu")}
    assert [table[f"gpu{g}<->sw0"][1] for g in range(3)] == [str(1 << 20)] * 3
