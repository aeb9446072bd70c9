"""What a job's ranks and its launcher agree on without MPI: deadlines, exit statuses, the failure files'
names, and how ranks are named and keyed in a fabric (ranks/session.py runs the ranks; launch/ reads these
without loading MPI)."""

from nvlink_emu.fabric.config import FabricConfig

DEFAULT_TIMEOUT_S = 60.0
INTERRUPTED_STATUS = 130  # the job's exit status after Ctrl-C: 128 + SIGINT, as shells report it
FAILURE_DIR_ENV = "NVLINK_EMU_FAILURE_DIR"
FAILURE_MARK = "nvlink-emu failure report sha256:"  # + the report's digest: this rank's word that it wrote it


def role_of(rank: int, config: FabricConfig) -> str:
    """"gpu" or "switch": the role of rank `rank` of the fabric's communicator (GPUs first)."""
    return "gpu" if rank < config.gpus else "switch"


def rank_name(rank: int, config: FabricConfig, world_rank: int | None = None) -> str:
    """How reports name rank `rank` of the fabric's communicator (at MPI rank `world_rank`): "gpu 2",
    "switch (rank 8)" on one node, "leaf 1 (rank 11)" or "spine 0 (rank 18)" on several."""
    if role_of(rank, config) == "gpu":
        return f"gpu {rank}"
    where = f"rank {rank if world_rank is None else world_rank}"
    if config.nodes == 1:
        return f"switch ({where})"
    switch = rank - config.gpus
    return f"leaf {switch} ({where})" if switch < config.nodes else f"spine {switch - config.nodes} ({where})"


def fabric_key(world_rank: int, config: FabricConfig) -> int:
    """The fabric rank (GPUs first, then switches) of MPI rank `world_rank` in fabric.topology's layout."""
    role, index = config.topology.role_of(world_rank)
    return index if role == "gpu" else config.gpus + index
