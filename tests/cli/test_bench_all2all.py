"""CLI tier: `nvlink-emu bench all2all` across nodes takes every all2all algorithm by name, runs the one auto
picks by fabric.cost_nodes (direct or pxn), and its emulated rows are `nvlink-emu model`'s prediction."""

import json

import pytest

from cli_helpers import command, run
from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.config import preset
from nvlink_emu.launch import cli
from nvlink_emu.launch.sweeps import check
from nvlink_emu.ranks.collectives import ALL2ALL

SHAPE = ["--preset", "superpod-h100-ib", "--nodes", "2", "--gpus-per-node", "2"]  # 2 x 2 GPUs, 2 spines


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_auto_runs_direct_or_pxn_as_modeled(capsys):
    config = preset("superpod-h100-ib", nodes=2, gpus=4)
    done, _ = run([command("nvlink-emu"), "bench", "all2all", "-b", "4K", "-e", "256K", "-f", "64", "-n", "1", *SHAPE,
                   "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    auto = [json.loads(line) for line in done.stdout.splitlines()]
    # pxn's extra hop costs more than it saves at 4K, and at 256K its extra NVLink bytes (5.19 us against 5.04):
    # direct's Latin-square order keeps every inbound share busy (before it, pxn won at 256K)
    assert [r["algorithm"] for r in auto] == ["direct", "direct"]
    # direct: every GPU link (NG-1) s each way, s = S / (N G): 3 s (pxn's would be 3 s + (N-1)(G-1) s)
    s = [row["size_bytes"] // 4 for row in auto]
    assert [(r["tx_bytes_per_gpu"], r["rx_bytes_per_gpu"]) for r in auto] == [(3 * s[0],) * 2, (3 * s[1],) * 2]
    for row in auto:
        assert row["wrong"] == 0
        want = cost_nodes.modeled_ns("all2all", row["algorithm"], config.topology, row["size_bytes"], config)
        assert abs(row["modeled_us"] - want / 1e3) < 1e-3, row
    assert cli.main(["model", "all2all", "-b", "4K", "-e", "256K", "-f", "64", *SHAPE, "--json"]) == 0
    modeled = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    keys = ("size_bytes", "count", "algorithm", "modeled_us", "algbw_gbps", "busbw_gbps", "tx_bytes_per_gpu",
            "rx_bytes_per_gpu")
    assert [{k: r[k] for k in keys} for r in modeled] == [{k: r[k] for k in keys} for r in auto]


def test_bench_takes_every_all2all_algorithm_by_name():
    config = preset("superpod-h100-ib", nodes=2, gpus=4)
    for name in ("auto", *ALL2ALL):
        args = cli.build_parser().parse_args(["bench", "all2all", "--algorithm", name])
        check(args, config)  # no error: the ranks run it (comm.all2all's algorithm)
