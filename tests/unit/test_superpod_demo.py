"""The demo's part 4 tables (launch/superpod_demo.py): busbw and speed-up arithmetic, the algorithm each
collective ran, and the payload bytes per level, from made-up runs."""

from nvlink_emu.launch.superpod_demo import PRESETS, SIZE, algorithms, level_bytes, step_table

REPORT = {"links": {"gpu0->sw0": {"payload_bytes": 5}, "sw0->gpu0": {"payload_bytes": 7},
                    "sw0->sw2": {"payload_bytes": 11}, "sw2->sw0": {"payload_bytes": 13}},
          "collectives": [
              {"gpu": 1, "collective": "all2all", "algorithm": "direct", "size_bytes": SIZE},
              {"gpu": 0, "collective": "allreduce", "algorithm": "ring", "size_bytes": 4096},  # not a timed step
              {"gpu": 0, "collective": "all2all", "algorithm": "pxn", "size_bytes": SIZE},
              {"gpu": 0, "collective": "allreduce", "algorithm": "hier", "size_bytes": SIZE},
              {"gpu": 0, "collective": "allreduce", "algorithm": "ring", "size_bytes": SIZE}]}  # a later call


def test_levels_split_gpu_links_from_links_between_switches():
    assert level_bytes(REPORT) == {"gpu-leaf": 12, "leaf-spine": 24}


def test_the_algorithms_are_gpu_0_s_first_timed_calls():
    assert algorithms(REPORT) == {"all2all": "pxn", "allreduce": "hier"}


def test_busbw_and_speed_up_per_step():
    times = {PRESETS[0]: 40_000.0, PRESETS[1]: 20_000.0, PRESETS[2]: 10_000.0}
    results = {p: ({"all2all": (1, ns, 100), "allreduce": (1, ns / 2, 200), "dlrm-step": (1, ns * 3, 300)}, REPORT)
               for p, ns in times.items()}
    rows = {(r[0], r[1]): r for r in (line.split() for line in step_table(results, 8).splitlines()[2:])}
    # all2all: 1 MiB / 10 us x 7/8 = 91.75 GB/s; allreduce: 1 MiB / 5 us x 2 x 7/8 = 367.0 GB/s
    assert rows[PRESETS[2], "all2all"][2:] == ["pxn", "10.000", "91.8", "4.00x", "100"]
    assert rows[PRESETS[2], "allreduce"][2:] == ["hier", "5.000", "367.0", "4.00x", "200"]
    assert rows[PRESETS[1], "dlrm-step"][2:] == ["-", "60.000", "-", "2.00x", "300"]
    assert rows[PRESETS[0], "all2all"][5] == "1.00x"
