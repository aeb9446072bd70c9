"""CLI tier, in-process (the command's main, no rank started): `nvlink-emu model` prints bench's keys from
the cost model the emulated runs are checked against (fabric.cost_nodes' replay of the plans, on one node
as on several; fabric.cost's closed forms its oracle on one), with auto resolved as the ranks resolve it, the shapes emulation validated, and typed errors."""

import json

import pytest

from nvlink_emu.fabric import cost, cost_nodes
from nvlink_emu.fabric.config import preset
from nvlink_emu.launch import cli, jobs
from nvlink_emu.launch.tiers import NODE_PRESETS, NODE_SHAPES, TIER_WORLD_SIZES, validated_shapes
from nvlink_emu.ranks.collectives import ALL2ALL, choose

KEYS = {"size_bytes", "count", "dtype", "op", "root", "algorithm", "modeled_us", "algbw_gbps", "busbw_gbps",
        "tx_bytes_per_gpu", "rx_bytes_per_gpu", "validated_by_emulation"}


def model(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `nvlink-emu model ARGV`."""
    status = cli.main(["model", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def rows_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def gpu0(links: dict) -> tuple[int, int]:
    return (sum(b for k, b in links.items() if k.startswith("gpu0->")),
            sum(b for k, b in links.items() if k.endswith("->gpu0")))


def test_rows_are_bench_s_keys_from_cost_nodes_and_no_rank_starts(capsys, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("model started a job")

    monkeypatch.setattr(jobs.subprocess, "Popen", no_launch)
    status, out, err = model(capsys, "allreduce", "--preset", "superpod-h100-ib", "--nodes", "2", "--gpus-per-node",
                             "2", "-b", "1K", "-e", "1M", "-f", "32", "--json")
    assert status == 0, err
    rows = rows_of(out)  # stdout: JSON lines only
    config = preset("superpod-h100-ib", nodes=2, gpus=4)  # 2 spines, one per rail
    assert [r["size_bytes"] for r in rows] == [1024, 32768, 1048576]
    # auto's choice changes within the sweep (at 1 MiB ring, whose channels run as independent pipelines)
    assert {r["algorithm"] for r in rows} == {"direct", "ring"}
    for row in rows:
        assert set(row) == KEYS
        S, algorithm = row["size_bytes"], row["algorithm"]
        assert algorithm == choose("allreduce", "auto", config, S)
        ns = cost_nodes.modeled_ns("allreduce", algorithm, config.topology, S, config)
        assert row["modeled_us"] == round(ns / 1e3, 4)
        assert row["algbw_gbps"] == round(S / ns, 3) and row["busbw_gbps"] == round(S / ns * 2 * 3 / 4, 3)
        assert (row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == gpu0(
            cost_nodes.link_bytes("allreduce", algorithm, config.topology, S, config=config))
        assert row["op"] == "sum" and row["root"] is None and row["dtype"] == "float32"
        assert row["validated_by_emulation"] is ((2, 2, 2) in [NODE_SHAPES[w] for w in TIER_WORLD_SIZES["nodes"]])
    # the validated shapes come from the tiers' own table, not from a copy
    note = next(line for line in err.splitlines() if line.startswith("# validated by emulation"))
    for world in TIER_WORLD_SIZES["nodes"]:
        nodes, per_node, spines = NODE_SHAPES[world]
        assert f"{nodes} nodes x {per_node} GPUs ({spines} spine" in note
    assert all(name in note for name in NODE_PRESETS)
    assert note.endswith("this shape, 2 nodes x 2 GPUs (2 spines), is one of them")
    # 3 x 2 GPUs from the command line has a spine per rail, 2: not the tier's 3 x 2 with 1
    _, _, err = model(capsys, "allreduce", "--preset", "superpod-h100-ib", "--nodes", "3", "--gpus-per-node", "2",
                      "-b", "1K", "-e", "1K", "--json")
    assert err.splitlines()[-2].endswith("this shape, 3 nodes x 2 GPUs (2 spines), was not emulated: a prediction")


def test_all2all_auto_is_the_faster_of_its_algorithms_by_the_replay(capsys):
    status, out, err = model(capsys, "all2all", "--preset", "superpod-h100-ib", "--nodes", "2", "--gpus-per-node", "4",
                             "-b", "8K", "-e", "8M", "-f", "32", "--json")
    assert status == 0, err
    config = preset("superpod-h100-ib", nodes=2, gpus=8)
    rows = rows_of(out)
    for row in rows:
        times = {a: cost_nodes.modeled_ns("all2all", a, config.topology, row["size_bytes"], config) for a in ALL2ALL}
        assert row["algorithm"] == min(times, key=times.get)
        assert row["modeled_us"] == round(times[row["algorithm"]] / 1e3, 4)
        assert row["validated_by_emulation"] is False  # 2 x 4 GPUs: no tier runs it
    # 8 KiB: pxn's extra hop costs latency; 256 KiB, 8 MiB: its extra NVLink bytes (98.8 us against 91.4 at 8
    # MiB), since direct's Latin-square order keeps every inbound share busy (before it, pxn won both)
    assert [r["algorithm"] for r in rows] == ["direct", "direct", "direct"]
    assert "2 nodes x 4 GPUs (4 spines), was not emulated: a prediction" in err


def test_one_node_is_the_replay_and_hier_there_is_the_ring(capsys):
    status, out, err = model(capsys, "allreduce", "--preset", "dgx-h100", "-b", "64K", "-e", "16M", "-f", "16", "--json")
    assert status == 0, err
    config = preset("dgx-h100")
    for row in rows_of(out):  # auto: direct up to 8 MiB (NCCL's software latency, fabric.software), then sharp
        algorithm = choose("allreduce", "auto", config, row["size_bytes"])
        assert row["algorithm"] == algorithm
        ns = cost_nodes.modeled_ns("allreduce", algorithm, config.topology, row["size_bytes"], config)
        assert row["modeled_us"] == round(ns / 1e3, 4)
        assert ns == pytest.approx(cost.modeled_ns("allreduce", algorithm, row["size_bytes"], 8, config), rel=0.01)
        assert (row["tx_bytes_per_gpu"], row["rx_bytes_per_gpu"]) == cost.payload_bytes("allreduce", algorithm,
                                                                                        row["size_bytes"], 8)
        assert row["validated_by_emulation"] is ((1, 8, 0) in validated_shapes())
    # the table, as bench prints it: the 1 MiB dgx-h100 figure of bench --compare in docs/guide/bench-and-model.md
    status, out, _ = model(capsys, "allreduce", "--preset", "dgx-h100", "-b", "1M", "-e", "1M")
    assert status == 0
    lines = out.splitlines()
    assert lines[1].split()[:9] == ["size", "count", "type", "redop", "root", "algorithm", "modeled_us", "algbw",
                                    "busbw"]
    assert lines[2].split()[:9] == ["1048576", "262144", "float32", "sum", "-1", "direct", "18.822", "55.71", "97.49"]
    assert lines[3] == "# Avg bus bandwidth    : 97.492"
    # fabric.cost has no form for hier: the replay, which on one node is ring's schedule and time (the links alone:
    # NCCL's software latency charges hier as its Tree, ring as its Ring)
    _, hier, _ = model(capsys, "allreduce", "--preset", "h100-ib", "--gpus", "6", "-b", "6K", "-e", "6M", "-f", "1024",
                       "--algorithm", "hier", "--json", "--software", "none")
    _, ring, _ = model(capsys, "allreduce", "--preset", "h100-ib", "--gpus", "6", "-b", "6K", "-e", "6M", "-f", "1024",
                       "--algorithm", "ring", "--json", "--software", "none")
    for h, r in zip(rows_of(hier), rows_of(ring), strict=True):
        assert h["algorithm"] == "hier" and r["algorithm"] == "ring"
        assert h["modeled_us"] == pytest.approx(r["modeled_us"], abs=1e-4)
        assert h["tx_bytes_per_gpu"] == r["tx_bytes_per_gpu"] == 2 * 5 * h["size_bytes"] // 6


def test_a_config_file_like_bench(capsys, tmp_path):
    path = tmp_path / "pod.toml"
    path.write_text('base = "superpod-a100-ib"\nnodes = 2\ngpus = 4\nspines = 1\n')
    status, out, err = model(capsys, "broadcast", "--config", str(path), "-b", "64K", "-e", "64K", "--json")
    assert status == 0, err
    (row,) = rows_of(out)
    config = preset("superpod-a100-ib", nodes=2, gpus=4, spines=1)
    ns = cost_nodes.modeled_ns("broadcast", row["algorithm"], config.topology, 65536, config, root=0)
    assert row["root"] == 0 and row["op"] == "none" and row["modeled_us"] == round(ns / 1e3, 4)


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_the_256_gpu_shape(capsys):
    # 32 DGX H100 nodes on the NVLink Switch System, 16 MiB, hier's node stages in the leaf
    status, out, err = model(capsys, "allreduce", "--preset", "superpod-h100-nvlink", "--nodes", "32",
                             "--gpus-per-node", "8", "-b", "16M", "-e", "16M", "--algorithm", "hier_nvls")
    assert status == 0, err
    assert "(32 nodes x 8 GPUs (8 spines) = 256 GPUs, nvlink4-nccl)" in out.splitlines()[0]  # calibrated NVLink
    config = preset("superpod-h100-nvlink", nodes=32, gpus=256)
    S = 16 << 20
    row = out.splitlines()[2].split()
    ns = cost_nodes.modeled_ns("allreduce", "hier_nvls", config.topology, S, config)
    assert row[:6] == [str(S), str(S // 4), "float32", "sum", "-1", "hier_nvls"]
    assert float(row[6]) == pytest.approx(ns / 1e3, abs=5.5e-4)  # round(us, 4) printed to 3 decimals
    # hier_nvls's per-GPU bytes, its node stages in the leaf (cost_nodes.hier_leaf_link_bytes' closed form):
    # S + S/G + 2(N-1)/(NG) S each way
    assert int(row[9]) == int(row[10]) == S + S // 8 + 2 * 31 * S // 256
    assert "this shape, 32 nodes x 8 GPUs (8 spines), was not emulated: a prediction" in out
    assert out.splitlines()[-1].startswith("# 1 rows in ")


@pytest.mark.parametrize("argv,message", [
    (["allreduce", "--preset", "superpod-h100-ib", "--nodes", "0"], "--nodes: must be a positive integer, got 0"),
    (["allreduce", "-b", "0"], "model: need 0 < --min-bytes <= --max-bytes and --factor >= 2; got 0,"),
    (["allreduce", "-b", "2M", "-e", "1M"], "model: need 0 < --min-bytes <= --max-bytes"),
    (["allreduce", "--preset", "dgx-h200"], "preset: unknown preset 'dgx-h200'; known: dgx-h100,"),
    (["allreduce", "--preset", "h100-ib", "--algorithm", "sharp"],
     "UnsupportedOperation: allreduce with 'sharp': fabric 'h100-ib' has no in-switch reduction"),
    (["allreduce", "--preset", "superpod-h100-ib", "--algorithm", "nvls"],
     "UnsupportedOperation: allreduce with 'nvls': its 16 members are in 2 nodes of fabric 'superpod-h100-ib', and "
     "its spines do not reduce"),
    (["all2all", "--algorithm", "ring"], "UnsupportedOperation: all2all: unknown algorithm 'ring'; known: auto, direct, pxn"),
    (["allreduce", "--algorithm", "pxn"], "UnsupportedOperation: allreduce: unknown algorithm 'pxn'"),
    (["allreduce", "--preset", "superpod-a100-ib", "--algorithm", "hier_nvls"],
     "UnsupportedOperation: allreduce with 'hier_nvls': fabric 'superpod-a100-ib' has no in-switch reduction or "
     "multicast (needs NVLink Network mode with a SHARP switch); hier runs the node stages as rings"),
])
def test_bad_input_is_one_typed_line(capsys, argv, message):
    status, out, err = model(capsys, *argv)
    assert status == 2 and out == ""
    assert err.startswith(f"nvlink-emu: error: {message}") and err.count("\n") == 1, err
