"""fabric.config: presets, strict TOML loading, validation of impossible values, resolve(), digest()."""

import dataclasses
import math
from pathlib import Path

import pytest

from nvlink_emu.fabric.addressing import MAX_GPUS, assign_network_addresses
from nvlink_emu.fabric import config as config_module
from nvlink_emu.fabric.config import (DEFAULT_PRESET, INTEGER_RANGES, MIN_EFFICIENCY, PRESETS, FabricConfig,
                                      build_config, load_toml, preset, resolve)
from nvlink_emu.fabric.figures import MAX_GBYTES_PER_S, MAX_LATENCY_NS, MIN_GBYTES_PER_S
from nvlink_emu.fabric.errors import ConfigError, FabricError
from nvlink_emu.fabric.profiles import GPU_PROFILES, PROFILES, SYSTEMS, link_profile
from nvlink_emu.fabric.topology import Topology


def write_toml(tmp_path, text, name="fabric.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- presets -------------------------------------------------------------------------------------

def test_preset_dgx_h100_fields():
    cfg = preset("dgx-h100")
    assert cfg.name == "dgx-h100"
    assert cfg.mode == "network"
    assert cfg.gpus == 8
    assert cfg.switches == 1
    assert cfg.sharp is True
    assert cfg.link == "nvlink4-nccl"  # calibrated; dgx-h100-line keeps the line rate
    assert preset("dgx-h100-line").link == "nvlink4"
    assert cfg.world_size == 9
    assert cfg.partitions == (tuple(range(8)),)


def test_preset_dgx_a100_fields():
    cfg = preset("dgx-a100")
    assert cfg.name == "dgx-a100"
    assert cfg.mode == "classic"
    assert cfg.gpus == 8
    assert cfg.sharp is False
    assert cfg.link == "nvlink3-nccl"  # calibrated; dgx-a100-line keeps the line rate
    assert preset("dgx-a100-line").link == "nvlink3"
    assert cfg.world_size == 9


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100"])
def test_preset_gpus_override(name):
    cfg = preset(name, gpus=4)
    assert cfg.gpus == 4
    assert cfg.world_size == 5
    assert cfg.partitions == ((0, 1, 2, 3),)
    assert cfg.mode == PRESETS[name]["mode"]
    assert cfg.link == PRESETS[name]["link"]


def test_preset_unknown_name():
    with pytest.raises(ConfigError, match="dgx-z999"):
        preset("dgx-z999")


def test_preset_links_exist_with_units_and_sources():
    assert link_profile("nvlink3").bandwidth_gbytes_per_s == 300.0
    assert link_profile("nvlink4").bandwidth_gbytes_per_s == 450.0
    assert link_profile("ib-hdr").bandwidth_gbytes_per_s == 25.0
    assert link_profile("ib-ndr").bandwidth_gbytes_per_s == 50.0
    for profile in PROFILES.values():
        assert profile.source
    with pytest.raises(ConfigError, match="nvlink99"):
        link_profile("nvlink99")


def test_world_size_is_gpus_plus_switches():
    assert FabricConfig(gpus=3).world_size == 4
    assert FabricConfig(gpus=1).world_size == 2


def test_partition_of():
    cfg = FabricConfig(gpus=4, partitions=((0, 1), (2, 3)))
    assert [cfg.partition_of(g) for g in range(4)] == [0, 0, 1, 1]
    with pytest.raises(ConfigError, match="GPU 7"):
        cfg.partition_of(7)


def test_config_is_immutable():
    cfg = preset("dgx-h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.gpus = 2


# -- impossible values name the key ----------------------------------------------------------------

@pytest.mark.parametrize("overrides, key", [
    (dict(gpus=0), "gpus"),
    (dict(gpus=-2), "gpus"),
    (dict(gpus=True), "gpus"),
    (dict(gpus="8"), "gpus"),
    (dict(page_size_bytes=3000), "page_size_bytes"),
    (dict(page_size_bytes=0), "page_size_bytes"),
    (dict(alignment_bytes=96), "alignment_bytes"),
    (dict(mode="foo"), "mode"),
    (dict(mode="classic", sharp=True), "sharp"),
    (dict(sharp="yes"), "sharp"),
    (dict(link="token-ring"), "link"),
    (dict(mtu_bytes=0), "mtu_bytes"),
    (dict(header_bytes=-1), "header_bytes"),
    (dict(tlb_entries=0), "tlb_entries"),
    (dict(nodes=3), "gpus"),                                            # 8 GPUs over 3 nodes
    (dict(nodes=2, spines=5, uplink_gbytes_per_s_per_gpu=1.0, uplink_latency_ns=1.0), "spines"),  # 4 per node
    (dict(nodes=2, spines=0, uplink_gbytes_per_s_per_gpu=1.0, uplink_latency_ns=1.0), "spines"),
    (dict(nodes=2, uplink_latency_ns=1.0), "uplink_gbytes_per_s_per_gpu"),
    (dict(spines=1), "spines"),                                        # one node has no spines
    (dict(uplink_latency_ns=1.0), "uplink_latency_ns"),
    (dict(spine_switch_latency_ns=130.0), "spine_switch_latency_ns"),  # one node has no spines
    (dict(chunk_bytes=2 << 20, switch_buffer_bytes=1 << 20), "chunk_bytes"),
    (dict(gpus=4, partitions=((0, 1), (2,))), "partitions"),          # GPU 3 missing
    (dict(gpus=4, partitions=((0, 1), (1, 2, 3))), "partitions"),     # GPU 1 twice
    (dict(gpus=4, partitions=((0, 1, 2, 3, 4),)), "partitions"),      # GPU 4 does not exist
    (dict(gpus=4, partitions=((0, 1, 2, 3), ())), "partitions"),      # empty partition
    (dict(gpus=4, mode="classic", sharp=False, partitions=((0, 1), (2, 3))), "partitions"),
])
def test_impossible_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        build_config(overrides, "test")


def test_build_config_error_names_source():
    with pytest.raises(ConfigError, match=r"^my-source: gpus"):
        build_config({"gpus": 0}, "my-source")


def test_preset_override_error_names_key():
    with pytest.raises(ConfigError, match="gpus"):
        preset("dgx-h100", gpus=0)
    with pytest.raises(ConfigError, match="sharp"):
        preset("dgx-a100", sharp=True)


def test_valid_partitions_accepted():
    cfg = build_config({"gpus": 4, "partitions": [[0, 1], [2, 3]]}, "test")
    assert cfg.partitions == ((0, 1), (2, 3))


def test_partitions_must_be_list_of_lists():
    with pytest.raises(ConfigError, match="partitions"):
        build_config({"gpus": 2, "partitions": [0, 1]}, "test")


# every key that holds a number: int fields and the float overrides of the time model
NUMERIC_KEYS = [f.name for f in dataclasses.fields(FabricConfig) if f.type in (int, float | None)]


INT_KEYS = {f.name for f in dataclasses.fields(FabricConfig) if f.type is int}
BAD_NUMBERS = [(key, value) for key in NUMERIC_KEYS
               for value in (math.nan, math.inf, -math.inf, True, False) + ((1.0,) if key in INT_KEYS else ())]


@pytest.mark.parametrize("key, value", BAD_NUMBERS, ids=[f"{k}={v!r}" for k, v in BAD_NUMBERS])
def test_numeric_keys_refuse_nan_inf_and_booleans(key, value):
    with pytest.raises(ConfigError, match=f"^test: {key}: must be"):
        build_config({key: value}, "test")


def test_numeric_keys_are_the_ones_expected():
    # the test above must not pass vacuously: every numeric key of the config is in it
    assert {"gpus", "nodes", "uplink_gbytes_per_s_per_gpu", "uplink_latency_ns", "memory_capacity_bytes", "page_size_bytes", "mtu_bytes", "header_bytes",
            "tlb_entries", "switch_buffer_bytes", "chunk_bytes", "alignment_bytes", "bandwidth_gbytes_per_s",
            "link_latency_ns", "switch_latency_ns", "reduction_gbytes_per_s", "reduction_latency_ns"} <= set(NUMERIC_KEYS)


@pytest.mark.parametrize("partitions", [
    [[0, 1.0], [2, 3]],
    [[False, True], [2, 3]],
    [[0, 1], [2.0, 3.0]],
    [["0", "1"], ["2", "3"]],
    [[0, "1"], [2, 3]],
    [[0, 1], [[2, 3]]],
])
def test_partitions_hold_integer_gpu_indices_only(partitions):
    with pytest.raises(ConfigError, match=r"^test: partitions: GPU indices must be integers, got "):
        build_config({"gpus": 4, "partitions": partitions}, "test")


@pytest.mark.parametrize("mode", ["network", "classic"])
def test_gpus_are_bounded_by_the_network_address_space(mode):
    sharp = mode == "network"
    assert MAX_GPUS == 0x1000 - 0x100 == 3840
    assert build_config({"gpus": MAX_GPUS, "mode": mode, "sharp": sharp}, "test").world_size == MAX_GPUS + 1
    assert len(set(assign_network_addresses(MAX_GPUS))) == MAX_GPUS
    for gpus in (MAX_GPUS + 1, 5000):
        with pytest.raises(ConfigError, match=rf"^test: gpus: at most 3840 \(one network address each, "
                                              rf"0x100..0xfff\), got {gpus}$"):
            build_config({"gpus": gpus, "mode": mode, "sharp": sharp}, "test")
    with pytest.raises(ConfigError, match="gpus: at most 3840"):
        resolve("dgx-h100", gpus=5000)


# -- TOML ------------------------------------------------------------------------------------------

def test_toml_minimal(tmp_path):
    path = write_toml(tmp_path, 'mode = "network"\ngpus = 4\nsharp = true\nlink = "nvlink4"\n', "mine.toml")
    cfg = load_toml(path)
    assert cfg.gpus == 4
    assert cfg.name == "mine"  # defaults to the file stem
    assert cfg.world_size == 5


def test_toml_unknown_key_named(tmp_path):
    path = write_toml(tmp_path, 'gpus = 4\nbandwidth_gbs = 12\n')
    with pytest.raises(ConfigError, match="bandwidth_gbs") as info:
        load_toml(path)
    assert str(path) in str(info.value)


def test_toml_unknown_section_named(tmp_path):
    path = write_toml(tmp_path, 'gpus = 4\n[fabric]\nmode = "network"\n')
    with pytest.raises(ConfigError, match="fabric"):
        load_toml(path)


@pytest.mark.parametrize("text, key", [
    ("gpus = 0\n", "gpus"),
    ("page_size_bytes = 1000\n", "page_size_bytes"),
    ('mode = "foo"\n', "mode"),
    ('mode = "classic"\nsharp = true\n', "sharp"),
    ("gpus = 4\npartitions = [[0, 1], [1, 2, 3]]\n", "partitions"),
    ("gpus = 4\npartitions = [[0, 1], [2]]\n", "partitions"),
    ("chunk_bytes = 4096\nswitch_buffer_bytes = 2048\n", "chunk_bytes"),
])
def test_toml_impossible_values_name_the_key(tmp_path, text, key):
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError, match=key):
        load_toml(path)


def test_toml_base_preset(tmp_path):
    path = write_toml(tmp_path, 'base = "dgx-a100"\ngpus = 4\n', "a100-small.toml")
    cfg = load_toml(path)
    assert cfg.mode == "classic"
    assert cfg.sharp is False
    assert cfg.link == "nvlink3-nccl"
    assert cfg.gpus == 4
    assert cfg.name == "a100-small"


def test_toml_base_unknown(tmp_path):
    path = write_toml(tmp_path, 'base = "dgx-nope"\n')
    with pytest.raises(ConfigError, match="base"):
        load_toml(path)


def test_toml_base_not_a_string(tmp_path):
    path = write_toml(tmp_path, 'base = ["dgx-a100"]\n')
    with pytest.raises(ConfigError, match="base"):
        load_toml(path)


def test_toml_overrides_win(tmp_path):
    path = write_toml(tmp_path, 'base = "dgx-h100"\ngpus = 4\n')
    assert load_toml(path, gpus=2).gpus == 2


def test_toml_bad_syntax(tmp_path):
    path = write_toml(tmp_path, "gpus = = 4\n[[\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(path)


def test_toml_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_toml(tmp_path / "absent.toml")


@pytest.mark.parametrize("text, key", [
    ("bandwidth_gbytes_per_s = nan\n", "bandwidth_gbytes_per_s"),
    ("link_latency_ns = inf\n", "link_latency_ns"),
    ("reduction_gbytes_per_s = -inf\n", "reduction_gbytes_per_s"),
    ("switch_latency_ns = true\n", "switch_latency_ns"),
    ("gpus = nan\n", "gpus"),
    ("nodes = true\n", "nodes"),
    ("nodes = 1.0\n", "nodes"),
    ("nodes = 2\nspines = 1.0\nuplink_gbytes_per_s_per_gpu = 1\nuplink_latency_ns = 1\n", "spines"),
    ("gpus = 5000\n", "gpus"),
    ("gpus = 4\npartitions = [[0, 1.0], [2, 3]]\n", "partitions"),
    ("gpus = 4\npartitions = [[false, true], [2, 3]]\n", "partitions"),
    ('gpus = 4\npartitions = [["0", "1"], [2, 3]]\n', "partitions"),
])
def test_toml_bad_numbers_name_the_key(tmp_path, text, key):
    path = write_toml(tmp_path, 'base = "dgx-h100"\n' + text)
    with pytest.raises(ConfigError, match=f"^{path}: {key}: "):
        load_toml(path)


def test_toml_path_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match=f"^{tmp_path}: is a directory, not a config file$"):
        load_toml(tmp_path)


@pytest.mark.parametrize("content", [bytes(range(256)), b"\x89PNG\r\n\x1a\n\x00\x00", b"gpus = 4\n\xff\n"])
def test_toml_binary_file_is_not_toml(tmp_path, content):
    path = tmp_path / "fabric.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"^{path}: not (a TOML file: byte [0-9]+ is not UTF-8 text|valid TOML)"):
        load_toml(path)


# -- resolve() ---------------------------------------------------------------------------------------

def test_resolve_default_is_default_preset():
    assert resolve() == preset(DEFAULT_PRESET)
    assert resolve().name == "dgx-h100"


def test_resolve_preset_with_gpus():
    cfg = resolve("dgx-a100", gpus=2)
    assert (cfg.name, cfg.mode, cfg.gpus) == ("dgx-a100", "classic", 2)


def test_resolve_config_with_gpus(tmp_path):
    path = write_toml(tmp_path, 'base = "dgx-h100"\ngpus = 4\n')
    assert resolve(config_path=str(path), gpus=3).gpus == 3


def test_resolve_both_is_error(tmp_path):
    path = write_toml(tmp_path, "gpus = 4\n")
    with pytest.raises(ConfigError, match="not both"):
        resolve("dgx-h100", str(path))


@pytest.mark.parametrize("gpus", [0, -1])
def test_resolve_bad_gpus(gpus):
    with pytest.raises(ConfigError, match="gpus"):
        resolve("dgx-h100", gpus=gpus)


def test_config_error_is_fabric_error():
    assert issubclass(ConfigError, FabricError)


# -- digest() ----------------------------------------------------------------------------------------

def test_digest_stable():
    a, b = preset("dgx-h100"), preset("dgx-h100")
    assert a.digest() == b.digest()
    assert len(a.digest()) == 16
    int(a.digest(), 16)  # hex


@pytest.mark.parametrize("overrides", [
    dict(gpus=4), dict(mtu_bytes=512), dict(header_bytes=32), dict(tlb_entries=8), dict(sharp=False),
    dict(link="nvlink5"), dict(partitions=((0, 1, 2, 3), (4, 5, 6, 7))),
])
def test_digest_changes_with_any_field(overrides):
    assert preset("dgx-h100", **overrides).digest() != preset("dgx-h100").digest()


def test_digest_changes_with_name():
    cfg = preset("dgx-h100")
    assert dataclasses.replace(cfg, name="other").digest() != cfg.digest()


def test_digest_differs_between_presets():
    assert preset("dgx-h100").digest() != preset("dgx-a100").digest()


# -- bounds: every numeric key has a physically meaningful range (issue 25, item 7) --------------------

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
MULTI = dict(nodes=2, uplink_gbytes_per_s_per_gpu=100.0, uplink_latency_ns=500.0)  # keys of several nodes
# key, least, most, the settings beside it (what makes the key apply, or lets the bound itself stand)
BOUNDS = [
    ("bandwidth_gbytes_per_s", 1e-3, 1e6, {}),
    ("reduction_gbytes_per_s", 1e-3, 1e6, {}),
    ("uplink_gbytes_per_s_per_gpu", 1e-3, 1e6, MULTI),
    ("link_latency_ns", 0.0, 1e9, {}),
    ("switch_latency_ns", 0.0, 1e9, {}),
    ("reduction_latency_ns", 0.0, 1e9, {}),
    ("uplink_latency_ns", 0.0, 1e9, MULTI),
    ("spine_switch_latency_ns", 0.0, 1e9, MULTI),
    ("compute_efficiency", 1e-3, 1.0, {}),
    ("memory_efficiency", 1e-3, 1.0, {}),
    ("gpus", 1, 3840, {}),
    ("nodes", 1, 3840, dict(gpus=3840)),  # several nodes take MULTI's uplinks too (_settings)
    ("memory_capacity_bytes", 4 * KiB, TiB, {}),
    ("page_size_bytes", 4 * KiB, GiB, {}),
    ("mtu_bytes", 16, 64 * KiB, {}),
    ("header_bytes", 0, KiB, {}),
    ("tlb_entries", 1, 1 << 20, {}),
    ("switch_buffer_bytes", 256, GiB, dict(chunk_bytes=256)),
    ("chunk_bytes", 256, GiB, dict(switch_buffer_bytes=GiB)),
    ("nvls_chunk_bytes", 256, GiB, {}),
    ("alignment_bytes", 1, 2 * MiB, {}),
]
FLOAT_KEYS = {key for key, least, _, _ in BOUNDS if isinstance(least, float)}


def _settings(key, value, extra) -> dict:
    """`key` = `value` with the settings beside it; several nodes need their uplinks."""
    several = key == "nodes" and isinstance(value, int) and value > 1
    return {**extra, **(MULTI if several else {}), key: value}


def test_every_numeric_key_has_its_bounds_here():
    """The bounds below are the config's own (no key left out, none stale)."""
    assert {key for key, *_ in BOUNDS} == set(NUMERIC_KEYS) | {"compute_efficiency", "memory_efficiency"}
    for key, least, most, _ in BOUNDS:
        if key in INTEGER_RANGES:
            assert INTEGER_RANGES[key][:2] == (least, most), key
    assert (MIN_GBYTES_PER_S, MAX_GBYTES_PER_S, MAX_LATENCY_NS, MIN_EFFICIENCY) == (1e-3, 1e6, 1e9, 1e-3)


def _outside(least, most, integer: bool):
    """(a value just below least, one just above most)."""
    if integer:
        return least - 1, most + 1
    return (least - 1e-3 if least == 0 else least * 0.999), most * 1.001


CASES = [(key, where, value, extra)
         for key, least, most, extra in BOUNDS
         for where, value in zip(("below", "above"), _outside(least, most, key not in FLOAT_KEYS))]


@pytest.mark.parametrize("key, least, most, extra", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_each_bound_itself_is_accepted(key, least, most, extra):
    for value in (least, most):
        assert getattr(build_config(_settings(key, value, extra), "test"), key) == value


@pytest.mark.parametrize("key, where, value, extra", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_value_past_a_bound_is_refused_naming_key_value_and_range(key, where, value, extra):
    least, most = next((lo, hi) for k, lo, hi, _ in BOUNDS if k == key)
    with pytest.raises(ConfigError, match=f"^test: {key}: ") as info:
        build_config(_settings(key, value, extra), "test")
    message = str(info.value)
    assert repr(value) in message or str(value) in message, message
    if key == "gpus" and where == "above":
        assert "at most 3840" in message  # its own message: the network addresses
    elif key in FLOAT_KEYS and least == 0 and where == "below":
        assert "must be a finite non-negative number" in message
    elif key in FLOAT_KEYS:
        assert f"{least:g}..{most:g}" in message, message
    else:
        assert f"must be in {least}..{most}" in message, message


@pytest.mark.parametrize("settings, key", [
    (dict(bandwidth_gbytes_per_s=1e-305), "bandwidth_gbytes_per_s"),        # every modeled time inf
    (dict(link_latency_ns=1e308), "link_latency_ns"),
    (dict(memory_capacity_bytes=1 << 50), "memory_capacity_bytes"),          # 1 PiB: numpy's MemoryError
    (dict(nvls_chunk_bytes=1), "nvls_chunk_bytes"),                          # a 256 KiB allreduce > 90 s
    (dict(chunk_bytes=1), "chunk_bytes"),
    (dict(compute_efficiency=5e-324), "compute_efficiency"),
    (dict(uplink_gbytes_per_s_per_gpu=0.0, nodes=2, uplink_latency_ns=1.0), "uplink_gbytes_per_s_per_gpu"),
])
def test_the_reported_values_are_refused(settings, key):
    with pytest.raises(ConfigError, match=f"^dgx-h100: {key}: must be"):
        build_config({**PRESETS["dgx-h100"], **settings}, "dgx-h100")


@pytest.mark.parametrize("figure, value, fragment", [
    ("gpu_link", (1e-305, 150.0), "gpu_gbytes_per_s: must be in 0.001..1e+06 GB/s"),
    ("gpu_link", (450.0, 1e308), "gpu_latency_ns: must be in 0..1e+09 ns"),
    ("switch_latency_ns", 2e9, "switch_latency_ns: must be in 0..1e+09 ns"),
    ("uplink_latency_ns", 1e308, "uplink_latency_ns: must be in 0..1e+09 ns"),
    ("uplink_gbytes_per_s_per_node", 4e6 * 1.001, "uplink_gbytes_per_s_per_node: must be in 0.004..4e+06 GB/s"),
    ("uplink_gbytes_per_s_per_node", 0.0039, "uplink_gbytes_per_s_per_node: must be in 0.004..4e+06 GB/s"),
])
def test_a_topology_takes_the_configs_bounds(figure, value, fragment):
    args = dict(nodes=2, gpus_per_node=4, spines=2, gpu_link=(450.0, 150.0), uplink_gbytes_per_s_per_node=1800.0,
                uplink_latency_ns=200.0, switch_latency_ns=250.0)
    assert Topology.multi_node(**{**args, "uplink_gbytes_per_s_per_node": 4e6}).gpus == 8  # 4 GPUs' 1 PB/s
    with pytest.raises(ConfigError, match=fragment.replace("+", r"\+").replace(".", r"\.")):
        Topology.multi_node(**{**args, figure: value})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_within_the_bounds(name):
    cfg = preset(name)
    assert cfg.name == name
    for key, value in dataclasses.asdict(cfg.timing).items():
        config_module.check_figure(key, value)  # the link profile's figures too
    cfg.topology  # its links' figures, checked by Topology


@pytest.mark.parametrize("path", sorted((Path(config_module.__file__).parent.parent / "launch" / "examples")
                                        .glob("*.toml")), ids=lambda p: p.name)
def test_every_example_toml_loads(path):
    assert load_toml(path).name == path.stem


def test_the_examples_are_found():
    assert len(list((Path(config_module.__file__).parent.parent / "launch" / "examples").glob("*.toml"))) == 3


def test_every_profile_figure_is_within_the_bounds():
    for profile in PROFILES.values():
        for key in ("bandwidth_gbytes_per_s", "link_latency_ns", "switch_latency_ns", "reduction_gbytes_per_s",
                    "reduction_latency_ns"):
            config_module.check_figure(key, getattr(profile, key), f"{profile.name}: ")
    for gpu in GPU_PROFILES.values():
        config_module.check_figure("hbm_gbytes_per_s", gpu.hbm_gbytes_per_s, f"{gpu.name}: ")
    for system in SYSTEMS.values():
        config_module.check_figure("uplink_gbytes_per_s_per_node", system.uplink_gbytes_per_s_per_node,
                                   f"{system.name}: ", system.gpus_per_node)


@pytest.mark.parametrize("name", ["../../../tmp/evil", "a/b", "a\\b", "", "x" * 129, "two\nlines", "esc\x1b[2J",
                                  "nul\x00", 3])
def test_a_name_is_one_short_line_of_text_and_never_a_path(name):
    with pytest.raises(ConfigError, match=r"^test: name: must be 1\.\.128 printable characters without / or \\, got "):
        build_config({"name": name}, "test")


@pytest.mark.parametrize("name", ["custom", "my fabric (v2)", "x" * 128, "dgx-h100.small"])
def test_ordinary_names_are_taken(name):
    assert build_config({"name": name}, "test").name == name
