"""`nvlink-emu plan check|show`: an MSCCL-IR file and a registry algorithm validated, their per-link bytes
and modeled time printed; a bad file refused with the GPU, step and chunk named, status 2."""

import json

import pytest

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.config import resolve
from nvlink_emu.fabric.topology import Topology

from cli_helpers import ROOT, command, run

PLANS = ROOT / "tests" / "unit" / "plans"


def test_plan_check_prints_the_ring_files_link_bytes():
    done, _ = run([command("nvlink-emu"), "plan", "check", str(PLANS / "ring_allreduce_4.xml"), "-S", "4M"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# plan 'ring_allreduce_4': allreduce on 4 GPUs, 28 operations, valid")
    assert "modeled 20.309 us" in lines[1]  # fabric.plans.plan_ns, dgx-h100, 4 MiB
    rows = [line.split() for line in lines[3:]]
    assert len(rows) == 8 and all(row[1:] == ["6291456", "6684672"] for row in rows)  # 2 (n-1)/n x 4 MiB


def test_plan_show_lists_a_registry_plans_operations():
    done, _ = run([command("nvlink-emu"), "plan", "show", "recursive_doubling", "--gpus", "4", "-S", "64K"])
    assert done.returncode == 0, done.stderr
    assert "# GPU 3: 1 input, 1 output, 1 scratch chunks" in done.stdout
    assert "   0 ch0 send src o[0:1] to GPU 2" in done.stdout  # GPU 3's first partner: 3 xor 1


def test_a_bad_plan_is_refused_with_its_gpu_step_and_chunk(tmp_path):
    text = (PLANS / "ring_allreduce_4.xml").read_text()
    # GPU 2's first send names chunk 7 of its 4
    bad = text.replace('<gpu id="2" i_chunks="4" o_chunks="0" s_chunks="0">\n    <tb id="0" send="3" recv="1" chan="0">\n'
                       '      <step s="0" type="s" srcbuf="i" srcoff="1"',
                       '<gpu id="2" i_chunks="4" o_chunks="0" s_chunks="0">\n    <tb id="0" send="3" recv="1" chan="0">\n'
                       '      <step s="0" type="s" srcbuf="i" srcoff="7"')
    assert bad != text
    path = tmp_path / "bad.xml"
    path.write_text(bad)
    done, _ = run([command("nvlink-emu"), "plan", "check", str(path)])
    assert done.returncode == 2
    assert "PlanError: GPU 2 step 0 (send, channel 0) chunk 7: src chunks [7, 8) of buffer 'i' out of its 4" \
        in done.stderr, done.stderr
    done, _ = run([command("nvlink-emu"), "plan", "check", "recursive_doubling", "--gpus", "6"])
    assert done.returncode == 2 and "6 GPUs is not a power of two" in done.stderr


def test_plan_check_refuses_a_size_its_chunks_do_not_fit_and_a_path_that_is_no_file(tmp_path):
    plan = str(PLANS / "allgather_by_chunk_2.xml")
    done, _ = run([command("nvlink-emu"), "plan", "check", plan, "-S", "32"])
    assert done.returncode == 0, done.stderr
    done, _ = run([command("nvlink-emu"), "plan", "check", plan, "-S", "24"])
    assert done.returncode == 2
    assert "PlanError: GPU 0 step 1 (copy, channel 0) chunk 0: at 24 bytes (4-byte elements) a copy of 3 elements " \
        "into chunks of 4" in done.stderr, done.stderr
    done, _ = run([command("nvlink-emu"), "plan", "check", str(tmp_path)])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot be read (Is a directory)" in done.stderr


def test_model_times_a_plan_file_per_size():
    done, _ = run([command("nvlink-emu"), "model", "allreduce", "--plan", str(PLANS / "ring_allreduce_4.xml"),
                   "--gpus", "4", "-b", "4M", "-e", "4M", "--json"])
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.splitlines()[-1])
    # plan check's figures for the same call: 20.309 us, 2 (n-1)/n x 4 MiB on GPU 0's uplink and downlink
    assert (row["algorithm"], row["plan"], row["modeled_us"]) == ("plan", "ring_allreduce_4", 20.3093)
    assert row["tx_bytes_per_gpu"] == row["rx_bytes_per_gpu"] == 6291456
    assert "plan 'ring_allreduce_4': replayed by fabric.plans.plan_ns" in done.stderr
    done, _ = run([command("nvlink-emu"), "model", "allgather", "--plan", str(PLANS / "ring_allreduce_4.xml"),
                   "--gpus", "4"])
    assert done.returncode == 2 and "is a allreduce plan for 4 GPUs; asked for allgather" in done.stderr


@pytest.mark.parametrize("file, coll, shape", [
    ("ring_allreduce_4.xml", "allreduce", dict(gpus=4)),
    ("allpairs_allreduce_3.xml", "allreduce", dict(gpus=3)),  # 1K on 3 GPUs: uneven chunks, scratch
    ("copy_then_fold_allreduce_2.xml", "allreduce", dict(gpus=2)),  # not in place: writes o, then reads i
    ("two_step_alltoall_2x2.xml", "all2all", dict(preset="superpod-h100-nvlink", nodes=2, gpus_per_node=2)),
])
def test_bench_runs_a_plan_file_on_the_ranks_in_models_time(file, coll, shape):
    config = resolve(shape.get("preset"), None, shape.get("gpus"), shape.get("nodes"), shape.get("gpus_per_node"))
    shape = [part for key, value in shape.items() for part in (f"--{key.replace('_', '-')}", str(value))]
    sweep = ["-b", "1K", "-e", "64K", "-f", "64", "--json"]
    done, _ = run([command("nvlink-emu"), "bench", coll, "--plan", str(PLANS / file), *shape, *sweep, "-n", "1"],
                  timeout_s=300)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    modeled, _ = run([command("nvlink-emu"), "model", coll, "--plan", str(PLANS / file), *shape, *sweep])
    assert modeled.returncode == 0, modeled.stderr
    expected = [json.loads(line) for line in modeled.stdout.splitlines()]
    assert len(rows) == len(expected) == 2
    for row, want in zip(rows, expected):
        assert row["wrong"] == 0 and (row["algorithm"], row["plan"]) == ("plan", file.removesuffix(".xml"))
        # the ranks' modeled time and GPU 0's bytes are the replay's of the same plan, exactly
        for key in ("size_bytes", "modeled_us", "tx_bytes_per_gpu", "rx_bytes_per_gpu"):
            assert row[key] == want[key], (key, row, want)
    # every GPU link's counters: 2 calls per size (the checked one and -n 1), the plan's bytes summed
    plan = plans.load(PLANS / file)
    topo = config.topology if config.nodes > 1 else Topology.single(config)
    table = {line.split()[0]: line.split() for line in done.stderr.splitlines() if line.startswith("gpu")}
    links = [plans.plan_link_bytes(plan, topo, row["size_bytes"], config) for row in rows]
    for g in range(plan.gpus):
        other = (g + 1) % plan.gpus
        up = sum(bytes_[topo.route(g, other)[0].name][0] for bytes_ in links)
        down = sum(bytes_[topo.route(other, g)[-1].name][0] for bytes_ in links)
        cells = next(cells for name, cells in table.items() if name.startswith(f"gpu{g}<->"))
        assert (int(cells[1]), int(cells[4])) == (2 * up, 2 * down)


def test_bench_refuses_a_plan_for_another_shape_or_with_an_algorithm():
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--plan", str(PLANS / "ring_allreduce_4.xml"),
                   "--gpus", "3"])
    assert done.returncode == 2 and "is a allreduce plan for 4 GPUs; asked for allreduce on 3 GPUs" in done.stderr
    done, _ = run([command("nvlink-emu"), "bench", "allreduce", "--plan", str(PLANS / "ring_allreduce_4.xml"),
                   "--gpus", "4", "--algorithm", "ring"])
    assert done.returncode == 2 and "the plan is the algorithm; --algorithm ring does not apply" in done.stderr


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_plan_show_draws_the_replayed_timeline_per_gpu_and_link(tmp_path):
    path = tmp_path / "plan.png"
    done, _ = run([command("nvlink-emu"), "plan", "show", "ring", "--gpus", "4", "-S", "1M", "-o", str(path)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"wrote {path}"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image
    pixels = matplotlib.image.imread(path)[..., :3]
    colours = {tuple(p) for p in (pixels * 255).astype(int).reshape(-1, 3)[::7]}
    # 4 peers' colours, the waits' and the text on white: a drawing, not a blank page
    assert pixels.shape[0] > 400 and len(colours) > 50
    done, _ = run([command("nvlink-emu"), "plan", "check", "ring", "--gpus", "4", "-o", str(tmp_path / "x.png")])
    assert done.returncode == 2 and "-o draws a timeline: it is for `plan show`" in done.stderr
    done, _ = run([command("nvlink-emu"), "plan", "show", "ring", "--gpus", "4", "-o", str(tmp_path / "x.txt")])
    assert done.returncode == 2 and "name a .png, .svg or .pdf file" in done.stderr


@pytest.mark.parametrize("algorithm, size", [("tree", "4M"), ("hier", "1M")])
def test_plan_check_builds_a_sized_algorithm_for_the_call_and_times_it_as_the_replay(algorithm, size):
    """tree's and hier's plans depend on the call's size (their pieces): `plan check ALGORITHM -S` builds the
    plan of that size on the fabric (it refused them before: "built for a call's size") and prints the
    replay's own modeled time of the call (fabric.replay.replay_ns, float32)."""
    shape = ["--nodes", "2", "--gpus-per-node", "4", "--preset", "superpod-h100-ib"]
    done, _ = run([command("nvlink-emu"), "plan", "check", algorithm, *shape, "-S", size])
    assert done.returncode == 0, done.stderr
    config = resolve("superpod-h100-ib", None, None, 2, 4)
    nbytes = {"4M": 4 << 20, "1M": 1 << 20}[size]
    from nvlink_emu.fabric.replay import replay_ns
    expected = replay_ns("allreduce", algorithm, config.topology, nbytes, config)
    assert f"modeled {expected / 1000:.3f} us" in done.stdout.splitlines()[1]


def test_plan_check_of_an_in_switch_algorithm_says_where_its_time_is():
    done, _ = run([command("nvlink-emu"), "plan", "check", "sharp", "--gpus", "4"])
    assert done.returncode == 2
    assert "nvlink-emu model allreduce --algorithm sharp" in done.stderr
