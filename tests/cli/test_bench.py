"""CLI tier: `nvlink-emu bench` for every collective and algorithm: #wrong is 0 and the per-GPU
bytes follow the closed forms."""

import json

import pytest

from cli_helpers import command, run

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


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_bench_rows_are_right_and_exact(collective, algorithm):
    done, _ = run([command("nvlink-emu"), "bench", collective, "--algorithm", algorithm, "--gpus", str(N),
                   "--min-bytes", "3K", "--max-bytes", "48K", "--factor", "16", "--iters", "2", "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]  # stdout: JSON lines only
    assert [r["size_bytes"] for r in rows] == [3072, 49152]
    assert "# per-link counters" in done.stderr
    for row in rows:
        assert set(row) == {"size_bytes", "count", "dtype", "op", "algorithm", "wall_us", "native_wall_us",
                            "tx_bytes_per_gpu", "rx_bytes_per_gpu", "wrong", "modeled_us", "algbw_gbps", "busbw_gbps"}
        assert row["modeled_us"] > 0
        assert abs(row["algbw_gbps"] - row["size_bytes"] / (row["modeled_us"] * 1e3)) < 1e-2
        assert row["wrong"] == 0
        assert row["algorithm"] == ("direct" if collective == "all2all" else algorithm)
        assert row["wall_us"] > 0 and row["native_wall_us"] > 0
        S = row["size_bytes"]
        assert (row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == expected_bytes(collective, algorithm, S)


def test_bench_table_and_16_bit_types():
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--gpus", str(N), "--dtype", "bfloat16",
                   "--op", "avg", "--min-bytes", "6K", "--max-bytes", "6K", "--iters", "1"])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("6144")]
    assert len(lines) == 1
    fields = lines[0].split()
    assert fields[2:5] == ["bfloat16", "avg", "sharp"] and fields[9] == "n/a" and fields[-1] == "0"


def test_in_switch_algorithm_on_a_forwarding_switch_is_refused():
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--preset", "dgx-a100", "--gpus", str(N),
                   "--algorithm", "sharp", "--max-bytes", "4K"])
    assert done.returncode != 0
    assert "UnsupportedOperation" in done.stderr and "dgx-a100" in done.stderr


def test_bench_compare_prints_presets_side_by_side():
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--compare", "dgx-a100,dgx-h100,h100-ib",
                   "--gpus", str(N), "--min-bytes", "3M", "--max-bytes", "3M", "--iters", "1"], timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line.split() for line in done.stdout.splitlines() if line.strip().startswith("3145728"))
    # size, then per preset: algorithm, modeled us, busbw, time relative to the first; then #wrong
    assert row[1::4][:3] == ["ring", "sharp", "ring"] and row[-1] == "0"
    assert row[4] == "1.00"
    a100, h100, ib = (float(row[2 + 4 * i]) for i in range(3))
    assert h100 < a100 < ib  # SHARP on NVLink4 beats a ring on NVLink3, which beats InfiniBand NDR
