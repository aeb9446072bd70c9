"""CLI tier: today's systems (issue 28 part 5) run on the ranks at small sizes, bytes exact against the closed
forms and modeled times the cost model's, and `nvlink-emu model` takes them at full size (72 and 256 GPUs)."""

import json

import pytest

from cli_helpers import command, run
from nvlink_emu.fabric import cost, cost_nodes
from nvlink_emu.fabric.config import preset
from nvlink_emu.launch import cli


def bench(*argv) -> list[dict]:
    done, _ = run([command("nvlink-emu"), "bench", *argv, "--iters", "1", "--json"], timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def model(capsys, *argv) -> list[dict]:
    assert cli.main(["model", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
@pytest.mark.parametrize("algorithm", ["sharp", "ring"])
def test_gb200_nvl72_on_8_gpus(algorithm):
    """8 of the 72 GPUs on the ranks: sharp sends S and receives S, ring 2(n-1)/n S each way."""
    n, config = 8, preset("gb200-nvl72", gpus=8)
    rows = bench("allreduce", "--preset", "gb200-nvl72", "--gpus", str(n), "--algorithm", algorithm,
                 "-b", "64K", "-e", "1M", "-f", "16")
    assert [r["size_bytes"] for r in rows] == [65536, 1 << 20]
    for row in rows:
        S = row["size_bytes"]
        each = S if algorithm == "sharp" else 2 * (n - 1) * S // n
        assert (row["wrong"], row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == (0, each, each)
        assert row["modeled_us"] * 1e3 == pytest.approx(cost.modeled_ns("allreduce", algorithm, S, n, config),
                                                        rel=0.01)


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_dgx_gh200_on_2_nodes_of_2():
    """2 x 2 GH200 on the ranks, sharp's two-level allreduce and a direct All2All: the replay's time
    (emulated time equals it exactly) and the closed-form bytes: sharp S each way, All2All (n-1)/n S."""
    config = preset("dgx-gh200", nodes=2, gpus=4)
    shape = ["--preset", "dgx-gh200", "--nodes", "2", "--gpus-per-node", "2"]
    (reduce,) = bench("allreduce", *shape, "--algorithm", "sharp", "-b", "256K", "-e", "256K")
    (a2a,) = bench("all2all", *shape, "--algorithm", "direct", "-b", "256K", "-e", "256K")
    S = 256 << 10
    assert (reduce["wrong"], reduce["tx_bytes_per_gpu"], reduce["rx_bytes_per_gpu"]) == (0, S, S)
    assert (a2a["wrong"], a2a["tx_bytes_per_gpu"], a2a["rx_bytes_per_gpu"]) == (0, 3 * S // 4, 3 * S // 4)
    for row, collective, algorithm in ((reduce, "allreduce", "sharp"), (a2a, "all2all", "direct")):
        want = cost_nodes.modeled_ns(collective, algorithm, config.topology, S, config)
        assert abs(row["modeled_us"] - want / 1e3) < 1e-3, row


def test_full_sizes_model(capsys):
    """gb200-nvl72 at 72 GPUs (fabric.cost) and dgx-gh200 at 32 x 8 = 256 (the replay), 16 MiB sharp."""
    S = 16 << 20
    (row,) = model(capsys, "allreduce", "--preset", "gb200-nvl72", "-b", "16M", "-e", "16M", "--algorithm", "sharp")
    nvl72 = preset("gb200-nvl72")
    assert row["modeled_us"] == pytest.approx(cost.modeled_ns("allreduce", "sharp", S, 72, nvl72) / 1e3, abs=5e-4)
    assert (row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == (S, S)
    (row,) = model(capsys, "allreduce", "--preset", "dgx-gh200", "--nodes", "32", "--gpus-per-node", "8",
                   "-b", "16M", "-e", "16M", "--algorithm", "sharp")
    gh = preset("dgx-gh200", nodes=32, gpus=256)
    assert row["modeled_us"] == pytest.approx(
        cost_nodes.modeled_ns("allreduce", "sharp", gh.topology, S, gh) / 1e3, abs=5e-4)
    assert (row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == (S, S)
