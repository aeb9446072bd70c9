"""Helpers of the multi-rank tier: every test is one emulated run on MPI_COMM_WORLD (G GPUs + 1 switch)."""

from nvlink_emu.fabric.config import preset
from nvlink_emu.ranks.session import run_fabric
from nvlink_emu.ranks.transport import world_size


def gpus() -> int:
    """GPUs of the fabric a test runs: every rank but the switch."""
    return world_size() - 1


def run(main, timeout_s: float = 30.0, base: str = "dgx-h100", trusted: bool = True, **overrides):
    """Run main(gpu) on a fabric of world_size - 1 GPUs; returns this rank's RunResult. A failure
    propagates to pytest, whose report the package's pytest plugin prints before it ends the job
    (pyproject.toml sets nvlink_emu_abort_on_failure). `trusted`: every GPU counts honestly, so both
    ends of every link must agree."""
    result = run_fabric(preset(base, gpus=gpus(), **overrides), main, timeout_s=timeout_s, abort_on_error=False)
    if trusted:
        assert result.report["conservation"] == {}, result.report["conservation"]
    return result
