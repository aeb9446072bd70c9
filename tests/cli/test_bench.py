"""CLI tier: `nvlink-emu bench` for every collective and algorithm: #wrong is 0 and the per-GPU
bytes follow the closed forms; nccl-tests' conventions, GPU memory sized for the sweep, --plot."""

import json
import os
import sys

import pytest

from cli_helpers import ROOT, command, run
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.cost import payload_bytes
from nvlink_emu.ranks.collectives import choose

N = 3  # GPUs
CASES = [(c, a) for c in ("allreduce", "reduce_scatter", "allgather", "broadcast")
         for a in ("ring", "direct", "sharp", "nvls")] + [("all2all", "auto")]


def expected_bytes(collective, algorithm, S, n=N):
    """(tx, rx) payload of GPU 0 for one call of S bytes (broadcast root is GPU 0)."""
    ring_like = algorithm in ("ring", "direct")
    if collective == "allreduce":
        each = {"ring": 2 * (n - 1) * S // n, "direct": 2 * (n - 1) * S // n, "sharp": S, "nvls": (n + 1) * S // n}
        return each[algorithm], each[algorithm]
    if collective == "reduce_scatter":
        return ((n - 1) * S // n, (n - 1) * S // n) if ring_like else (S, S // n)
    if collective == "allgather":
        return ((n - 1) * S // n, (n - 1) * S // n) if ring_like else (S // n, S)
    if collective == "broadcast":
        return {"ring": (S, 0), "direct": ((n - 1) * S, 0), "sharp": (S, S), "nvls": (S, S)}[algorithm]
    return (n - 1) * S // n, (n - 1) * S // n


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
@pytest.mark.parametrize("collective,algorithm", CASES)
def test_bench_rows_are_right_and_exact(collective, algorithm):
    done, _ = run([command("nvlink-emu"), "bench", collective, "--algorithm", algorithm, "--gpus", str(N),
                   "--min-bytes", "3K", "--max-bytes", "48K", "--factor", "16", "--iters", "2", "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]  # stdout: JSON lines only
    assert [r["size_bytes"] for r in rows] == [3072, 49152]
    assert "# per-link counters" in done.stderr
    for row in rows:
        assert set(row) == {"size_bytes", "count", "dtype", "op", "root", "algorithm", "wall_us", "native_wall_us",
                            "tx_bytes_per_gpu", "rx_bytes_per_gpu", "wrong", "modeled_us", "algbw_gbps", "busbw_gbps"}
        # as nccl-tests prints them: redop none where nothing is reduced, a root for broadcast only
        assert row["op"] == ("sum" if collective in ("allreduce", "reduce_scatter") else "none")
        assert row["root"] == (0 if collective == "broadcast" else None)
        assert row["modeled_us"] > 0
        assert abs(row["algbw_gbps"] - row["size_bytes"] / (row["modeled_us"] * 1e3)) < 1e-2
        assert row["wrong"] == 0
        assert row["algorithm"] == ("direct" if collective == "all2all" else algorithm)
        assert row["wall_us"] > 0 and row["native_wall_us"] > 0
        S = row["size_bytes"]
        assert (row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == expected_bytes(collective, algorithm, S)


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_bench_table_and_16_bit_types():
    # sharp named: at 6 KiB auto picks direct (NCCL's software latency keeps NVLS off small calls, fabric.software)
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--gpus", str(N), "--dtype", "bfloat16",
                   "--op", "avg", "--min-bytes", "6K", "--max-bytes", "6K", "--iters", "1", "--algorithm", "sharp"])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("6144")]
    assert len(lines) == 1
    fields = lines[0].split()
    # size count type redop root algorithm modeled_us algbw busbw wall_us native_us ...
    assert fields[2:6] == ["bfloat16", "avg", "-1", "sharp"] and fields[10] == "n/a" and fields[-1] == "0"
    out = done.stdout.splitlines()
    assert out[1].split()[:6] == ["size", "count", "type", "redop", "root", "algorithm"]
    assert out[-2] == "# Out of bounds values : 0 OK" and out[-1].startswith("# Avg bus bandwidth    : ")
    assert abs(float(out[-1].split(":")[1]) - float(fields[8])) < 0.01  # one row: its busbw


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_broadcast_table_has_its_root_and_no_redop():
    done, _ = run([command("nvlink-emu"), "bench", "broadcast", "--gpus", str(N), "-b", "4K", "-e", "4K", "-n", "1"])
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line.split() for line in done.stdout.splitlines() if line.strip().startswith("4096"))
    assert row[2:6] == ["float32", "none", "0", choose("broadcast", "auto", preset("dgx-h100", gpus=N), 4096)]


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_nccl_tests_short_flags():
    done, _ = run([command("nvlink-emu"), "bench", "allgather", "--gpus", str(N), "-b", "3K", "-e", "12K", "-f", "4",
                   "-n", "1", "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line)["size_bytes"] for line in done.stdout.splitlines()] == [3072, 12288]


@pytest.mark.parametrize("argv,message", [
    (["all2all", "--algorithm", "sharp"], "bench all2all: --algorithm sharp does not apply: all2all's algorithms are auto, direct, pxn"),
    (["allgather", "--op", "max"], "bench allgather: --op max does not apply"),
    (["allreduce", "--", "-b", "1K"], "bench takes no arguments after --, got '-b 1K'"),
    (["allreduce", "--no-label"], "--no-label: bench's lines are never labelled"),
    (["allreduce", "--plot", "figure.txt"], "--plot figure.txt: name a .png, .svg or .pdf file"),
])
def test_options_that_would_do_nothing_are_errors_before_any_rank_starts(argv, message):
    done, elapsed = run([command("nvlink-emu"), "bench", "--gpus", str(N), *argv])
    assert done.returncode == 2
    assert done.stderr.startswith(f"nvlink-emu: error: {message}")
    assert done.stderr.count("\n") == 1 and done.stdout == ""


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_gpu_memory_is_sized_for_the_sweep(tmp_path):
    # a fabric whose GPUs hold 64 KiB: send + recv of a 48 KiB allreduce do not fit it
    config = tmp_path / "small.toml"
    config.write_text('base = "dgx-h100"\ngpus = 3\nmemory_capacity_bytes = 65536\n')
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--config", str(config), "-b", "48K", "-e", "48K",
                   "-n", "1", "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU memory on small raised from 65536 to 1048576 bytes per GPU (memory_capacity_bytes)" in done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["wrong"] == 0 and row["tx_bytes_per_gpu"] == payload_bytes("allreduce", row["algorithm"], 49152, 3)[0]
    # under a launcher of one's own, the bench says which key to raise, before any traffic
    done, _ = run([command("mpiexec"), "-n", "4", sys.executable, "-m", "nvlink_emu.launch",
                   str(ROOT / "launch" / "bench.py"), "--config", str(config), "--", "allreduce", "-b", "48K",
                   "-e", "48K"])
    assert done.returncode != 0
    assert "needs 98304 bytes of memory on each GPU" in done.stderr and "memory_capacity_bytes = 65536" in done.stderr


def test_a_sweep_that_cannot_fit_in_host_memory_is_refused_before_it_starts():
    with open("/proc/meminfo") as meminfo:
        available = sum(int(line.split()[1]) << 10 for line in meminfo if line.startswith(("MemAvailable", "SwapFree")))
    size = 1 << available.bit_length()  # 2 GPUs x (send + recv) of it: 4 x more than there is
    done, elapsed = run([command("nvlink-emu"), "bench", "allreduce", "--gpus", "2", "-b", str(size), "-e", str(size)])
    assert done.returncode == 2 and "of host memory (2 GPU ranks x" in done.stderr
    assert "lower --max-bytes (-e) or --gpus" in done.stderr and elapsed < 20


def test_in_switch_algorithm_on_a_forwarding_switch_is_refused():
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--preset", "dgx-a100", "--gpus", str(N),
                   "--algorithm", "sharp", "--max-bytes", "4K"])
    assert done.returncode != 0
    assert "UnsupportedOperation" in done.stderr and "dgx-a100" in done.stderr


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_bench_plot_draws_busbw_per_algorithm(tmp_path):
    figure = tmp_path / "busbw.png"
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--gpus", str(N), "--preset", "dgx-a100",
                   "-b", "16K", "-e", "256K", "-f", "4", "-n", "1", "--plot", str(figure)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {figure}" in done.stdout
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_bench_compare_prints_presets_side_by_side(tmp_path):
    figure = tmp_path / "compare.png"
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--compare", "dgx-a100,dgx-h100,h100-ib",
                   "--gpus", str(N), "--min-bytes", "3M", "--max-bytes", "3M", "--iters", "1", "--plot", str(figure)],
                  timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # progress on stderr while the presets run, a line per row
    progress = [line for line in done.stderr.splitlines() if line.startswith("nvlink-emu: bench allreduce: ")]
    assert [line.split()[3:5] for line in progress] == [["1/3", "dgx-a100:"], ["2/3", "dgx-h100:"], ["3/3", "h100-ib:"]]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert done.stdout.splitlines()[-2].startswith("# Avg bus bandwidth    : dgx-a100 ")
    row = next(line.split() for line in done.stdout.splitlines() if line.strip().startswith("3145728"))
    # size, then per preset: algorithm, modeled us, busbw, time relative to the first; then #wrong
    # `auto`: what the cost model names fastest (fabric.cost): direct on the forwarding switches, and at 3 MiB on
    # dgx-h100 too (NCCL's software latency: NVLS's 25 us against direct's LL p2p, fabric.software)
    assert row[1::4][:3] == ["direct", "direct", "direct"] and row[-1] == "0"
    assert row[1::4][:3] == [choose("allreduce", "auto", preset(p, gpus=N), 3 << 20) for p in ("dgx-a100", "dgx-h100", "h100-ib")]
    assert row[4] == "1.00"
    a100, h100, ib = (float(row[2 + 4 * i]) for i in range(3))
    assert h100 < a100 < ib  # SHARP on NVLink4 beats a ring on NVLink3, which beats InfiniBand NDR


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_bench_cpu_counts_every_rank_of_the_job(tmp_path):
    """--cpu: the ranks' CPU per timed call (GPU 0 reads /proc for every rank of its host), less bench's
    barrier and timing exchange; in the table a comment line under the row; with tracing, its CPU cost."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here (Linux only)")
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--algorithm", "ring", "--gpus", "2", "-b", "256K",
                   "-e", "256K", "-n", "3", "--cpu", "--json", "--trace-dir", str(tmp_path)])
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["wrong"] == 0
    # the ring's 2 steps of 128 KiB each way pass the switch, which copies and checks them: it runs
    assert row["cpu_us"] > row["switch_cpu_us"] > 0
    assert row["cpu_wall_us"] > 0 and row["sync_cpu_us"] > 0 and row["sync_wall_us"] > 0
    assert row["traced_cpu_us"] > 0 and row["untraced_cpu_us"] > 0
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--algorithm", "ring", "--gpus", "2", "-b", "4K",
                   "-e", "4K", "-n", "2", "--cpu"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# cpu per call: " in done.stdout and "cores busy" in done.stdout and "taken out" in done.stdout


def test_a_config_name_that_is_a_path_is_refused_and_writes_nothing(tmp_path):
    """Issue 25, item 7: a TOML `name` of "../../x" made bench write its sized config outside the temporary
    directory (over an existing file). The name is refused before any rank starts, and nothing is written."""
    victim = tmp_path / "victim.toml"
    victim.write_text("kept\n")
    config = tmp_path / "evil.toml"
    config.write_text(f'base = "dgx-h100"\ngpus = 2\nmemory_capacity_bytes = 65536\n'
                      f'name = "{"../" * 12}{str(victim)[1:-len(".toml")]}"\n')
    done, elapsed = run([command("nvlink-emu"), "bench", "allreduce", "--config", str(config), "-b", "48K", "-e", "48K",
                         "-n", "1"])
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"nvlink-emu: error: {config}: name: must be 1..128 printable characters "
                                  f"without / or \\, got '../"), done.stderr
    assert victim.read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == ["evil.toml", "victim.toml"]
    assert elapsed < 30
