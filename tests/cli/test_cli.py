"""CLI tier: `nvlink-emu run`, `nvlink-emu demo` and `python -m nvlink_emu.launch` as subprocesses under mpiexec."""

import sys
import textwrap

import pytest

from cli_helpers import ROOT, command, run, script

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


def test_run_prints_one_link_table_with_exact_bytes(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, PUT_SCRIPT), "--gpus", "3", "--", "5000"])
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if "<->sw0" in line}
    # 5000 B in 256 B packets: 20 packets, raw = 5000 + 20 x 16
    assert rows["gpu0<->sw0"][:3] == ["5000", "5320", "20"]
    assert rows["gpu1<->sw0"][3:6] == ["5000", "5320", "20"]
    assert done.stdout.count("# per-link counters") == 1


def test_demo_shows_isolation_and_classic_nvlink():
    done, elapsed = run([command("nvlink-emu"), "demo"], timeout_s=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "refused: AccessViolation" in out and "isolation holds" in out
    assert "landed" in out and "OVERWRITTEN" in out
    assert "refused after revoke" in out and "fixed at boot" in out
    assert out.count("OutOfMemory") == 2
    assert out.count("# per-link counters") == 2
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
    assert row[1::4][:3] == ["ring", "sharp", "ring"] and row[-1] == "0"
    assert float(row[6]) < float(row[2]) < float(row[10])  # dgx-h100 < dgx-a100 < h100-ib


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
    assert "# fabric fabric (network mode, 4 GPUs + 1 switch)" in done.stdout


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100"])
def test_the_readme_example_runs_on_both_kinds_of_nvlink(preset):
    example = str(ROOT / "launch" / "examples" / "put_ring.py")
    done, _ = run([command("nvlink-emu"), "run", example, "--gpus", "3", "--preset", preset])
    assert done.returncode == 0, done.stderr[-3000:]
    table = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.startswith("gpu")}
    assert [table[f"gpu{g}<->sw0"][1] for g in range(3)] == [str(1 << 20)] * 3  # 1 MiB out of every GPU
