"""One emulated run on an MPI communicator: ranks 0..G-1 are GPUs running main(gpu), rank G the switch."""

import sys
import traceback
from dataclasses import dataclass

from fabric.addressing import assign_network_addresses
from fabric.config import FabricConfig
from fabric.errors import ConfigError

from .gpu import Gpu
from .switch import SwitchRank
from .transport import Transport, abort_job, split_gpus

DEFAULT_TIMEOUT_S = 60.0


@dataclass
class RunResult:
    """What a run left on this rank: role ("gpu" or "switch"), rank, main's return value (GPU ranks)
    and the switch's report (links, ports, network addresses), identical on every rank."""

    role: str
    rank: int
    value: object
    report: dict


def role_of(rank: int, config: FabricConfig) -> str:
    return "gpu" if rank < config.gpus else "switch"


def run_fabric(config: FabricConfig, main, timeout_s: float = DEFAULT_TIMEOUT_S, comm=None,
               abort_on_error: bool = True) -> RunResult:
    """Run `main(gpu)` on every GPU rank while the switch rank serves; collective over `comm`.

    A world size that does not match the fabric is a ConfigError on every rank before any traffic.
    Any exception after that prints this rank's traceback, labelled, and aborts the whole job; with
    abort_on_error=False it propagates instead, for a caller that ends the job itself (the tests'
    conftest hook does, after pytest reports the failure).
    """
    if timeout_s <= 0:
        raise ConfigError(f"timeout: must be > 0 seconds, got {timeout_s}")
    transport = Transport(comm)
    if transport.size != config.world_size:
        size = transport.size
        transport.close()
        raise ConfigError(f"world size {size} does not match fabric {config.name!r}: {config.gpus} GPUs + "
                          f"{config.switches} switch = {config.world_size} ranks; run with mpiexec -n "
                          f"{config.world_size} (or pass --gpus {size - config.switches})")
    role = role_of(transport.rank, config)
    try:
        control = split_gpus(transport, role == "gpu")
        if role == "gpu":
            addresses = assign_network_addresses(config.gpus) if config.mode == "network" else ()
            gpu = Gpu(config, transport, control, config.gpus, addresses, timeout_s)
            value = main(gpu)
            report = gpu.finish()
            control.comm.Free()
        else:
            value, report = None, SwitchRank(config, transport, timeout_s).serve()
        transport.close()
        return RunResult(role, transport.rank, value, report)
    except BaseException:
        if not abort_on_error:
            raise
        name = f"{role} {transport.rank}" if role == "gpu" else f"switch (rank {transport.rank})"
        text = traceback.format_exc()
        prefix = f"[nvlink-emu {name}] "
        sys.stderr.write(f"{prefix}failed; ending the job\n" + "".join(prefix + line + "\n"
                                                                      for line in text.rstrip().split("\n")))
        abort_job(1)
        raise
