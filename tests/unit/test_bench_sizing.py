"""launch.sweeps and launch.bench without MPI: GPU memory sized for a sweep, the host-memory check, the config written
for the ranks, and the in-place input and result checks (no full-size temporaries)."""

import argparse
from pathlib import Path

import numpy as np
import pytest

from nvlink_emu.fabric import ConfigError, load_toml, preset
from nvlink_emu.launch.bench import PERIOD, TILE, contribution, count_wrong, fill
from nvlink_emu.launch.sweeps import check, check_host_memory, config_toml, gpu_memory_bytes, sized_config
from nvlink_emu.launch.units import format_bytes

MiB, GiB = 1 << 20, 1 << 30


def sweep(collective="allreduce", max_bytes=16 * MiB, dtype="float32", min_bytes=1024, algorithm="auto", op=None):
    return argparse.Namespace(collective=collective, min_bytes=min_bytes, max_bytes=max_bytes, factor=4, iters=0,
                              dtype=dtype, algorithm=algorithm, op=op)


@pytest.mark.parametrize("collective,expected", [
    ("allreduce", 2 * 256 * MiB),                  # send + recv, S each
    ("broadcast", 2 * 256 * MiB),
    ("all2all", 2 * 256 * MiB),
    ("reduce_scatter", 256 * MiB + 32 * MiB),      # send S, recv S / 8
    ("allgather", 32 * MiB + 256 * MiB),           # send S / 8, recv S
])
def test_gpu_memory_of_the_largest_call_on_8_gpus(collective, expected):
    assert gpu_memory_bytes(collective, 256 * MiB, np.dtype("float32"), 8, 256) == expected


def test_gpu_memory_rounds_each_buffer_as_the_allocator_does():
    # 1000 B of float32 -> 250 elements; allgather on 3 GPUs: 249 elements (83 per block)
    assert gpu_memory_bytes("allreduce", 1000, np.dtype("float32"), 3, 256) == 2 * 1024
    assert gpu_memory_bytes("allgather", 1000, np.dtype("float32"), 3, 256) == 512 + 1024  # 332 B, 996 B


def test_memory_is_raised_to_a_whole_mib_only_when_the_sweep_needs_it():
    config = preset("dgx-h100")
    assert sized_config(sweep(max_bytes=64 * MiB), config) is config  # 128 MiB fit the default 256 MiB
    raised = sized_config(sweep(max_bytes=GiB), config)
    assert raised.memory_capacity_bytes == 2 * GiB
    assert raised.gpus == 8 and raised.name == "dgx-h100" and raised.timing == config.timing
    small = preset("dgx-h100", gpus=3, memory_capacity_bytes=64 * 1024)
    assert sized_config(sweep(min_bytes=48 * 1024, max_bytes=48 * 1024), small).memory_capacity_bytes == MiB


def test_host_memory_check_counts_every_gpus_buffers():
    config = preset("dgx-h100")
    check_host_memory(sweep(max_bytes=GiB), config, available=17 * GiB)  # 8 x 2 GiB fit
    with pytest.raises(ConfigError, match=r"at least 16 GiB .*8 GPU ranks x 2 GiB.*15 GiB available.*--max-bytes"):
        check_host_memory(sweep(max_bytes=GiB), config, available=15 * GiB)
    check_host_memory(sweep(max_bytes=64 * GiB), config, available=None)  # unknown: no check


def test_the_config_file_for_the_ranks_reads_back_equal(tmp_path):
    config = preset("dgx-h100", gpus=4, partitions=((0, 1), (2, 3)), memory_capacity_bytes=3 * GiB,
                    link_latency_ns=120.5, reduction_gbytes_per_s=400)
    path = tmp_path / "sized.toml"
    path.write_text(config_toml(config))
    assert load_toml(path) == config
    classic = preset("dgx-a100")
    path.write_text(config_toml(classic))
    assert load_toml(path) == classic


def test_a_config_with_faults_reads_back_equal(tmp_path):
    """bench writes the sized config (its --faults plan included) for the ranks: the faults come back."""
    config = preset("dgx-h100", gpus=4, faults=[
        {"link": "gpu1<->sw0", "kind": "flap", "at_ns": 40000, "period_ns": 30000, "until_ns": 130000},
        {"link": "gpu1->sw0", "kind": "ber", "ber": 1e-6, "seed": 7}])
    path = tmp_path / "sized.toml"
    path.write_text(config_toml(config))
    assert load_toml(path) == config and len(config.faults) == 2


@pytest.mark.parametrize("argv,message", [
    (dict(collective="all2all", algorithm="sharp"), "all2all.s algorithms are auto, direct, pxn"),
    (dict(collective="allgather", op="max"), "allgather reduces nothing"),
    (dict(collective="broadcast", op="sum"), "broadcast reduces nothing"),
])
def test_options_that_would_do_nothing_are_refused(argv, message):
    with pytest.raises(ConfigError, match=message):
        check(sweep(**argv), preset("dgx-h100"))


def test_fill_writes_each_members_input_in_place_across_tiles():
    out = np.empty(TILE + 100, np.float32)
    fill(out, 3, 7, "sum")
    assert np.array_equal(out, contribution(3, 7, 7 + out.size, np.dtype(np.float32), "sum"))


def test_count_wrong_finds_every_wrong_element_across_tiles():
    values = contribution(1, 0, PERIOD, np.dtype(np.int32), "sum")
    actual = np.empty(TILE + 50, np.int32)
    fill(actual, 1, 5, "sum")
    segments = [(0, actual.size, values, 5)]
    assert count_wrong(actual, segments) == 0
    actual[[0, TILE - 1, TILE, TILE + 49]] += 1
    assert count_wrong(actual, segments) == 4


def test_sizes_for_people():
    assert [format_bytes(n) for n in (512, 3072, 1536 * 1024, GiB, 1024 * GiB)] == [
        "512 B", "3 KiB", "1.5 MiB", "1 GiB", "1024 GiB"]


@pytest.mark.parametrize("name", ["../../../../../../../../../../..{victim}", "..", "{victim}"])
def test_the_sized_config_file_is_named_by_the_temporary_directory_never_by_the_fabric(tmp_path, monkeypatch, name):
    """bench wrote the sized config to WORKDIR/{config.name}.toml: a `name` of "../../x" overwrote a file
    outside the temporary directory (issue 25, item 7). The config's validation refuses such names now;
    this fabric's name is forced past it, to show that the path does not depend on it at all."""
    from nvlink_emu.launch.commands import bench

    victim = tmp_path / "victim"
    workdir = tmp_path / "work" / "deeper"
    workdir.mkdir(parents=True)
    config = preset("dgx-h100", gpus=2)
    object.__setattr__(config, "name", name.format(victim=victim))
    sized = preset("dgx-h100", gpus=2, memory_capacity_bytes=512 * MiB)
    launched = []
    monkeypatch.setattr(bench, "sized_config", lambda args, c: sized)
    monkeypatch.setattr(bench, "launch_script", lambda script, args, *rest: launched.append(args.config) or 0)
    args = argparse.Namespace(**vars(sweep()), json=True, preset=None, config=None, gpus=None, trace_dir=None)
    assert bench.bench_launch(args, config, str(workdir), lambda row: None) == 0
    (path,) = launched
    assert Path(path).parent == workdir and Path(path).name.startswith("fabric-") and path.endswith(".toml")
    assert load_toml(path) == sized
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["work", "deeper", Path(path).name])


@pytest.mark.parametrize("name, part", [("dgx-h100", "dgx-h100"), ("..", "_.."), (".", "_."),
                                        ("my fabric/../x", "my_fabric_.._x"), ("a" * 100, "a" * 64)])
def test_a_name_in_a_directory_name_is_one_safe_component(name, part):
    from nvlink_emu.launch.jobs import file_part
    assert file_part(name) == part
