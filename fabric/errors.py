"""Typed errors of the emulated fabric: every message names ranks, addresses and the operation."""


class FabricError(Exception):
    """Base class of every error the emulator raises on purpose."""


class ConfigError(FabricError):
    """A fabric description (preset, TOML file, command line) is invalid; raised before any traffic."""


class AccessViolation(FabricError):
    """The switch refused a remote access (unmapped, revoked, not allowed, other partition, out of bounds)."""


class OutOfMemory(FabricError):
    """An allocation does not fit in one GPU's memory (VRAM is never merged across GPUs)."""


class UnsupportedOperation(FabricError):
    """The operation does not exist in this fabric mode or on this switch (e.g. export on classic NVLink)."""


class CollectiveMismatch(FabricError):
    """Members of a communicator called different collectives (or with different arguments)."""


class FabricTimeout(FabricError):
    """A blocking wait passed its deadline; the message names the rank, the operation and whom it waited for."""


class ProtocolError(FabricError):
    """A rank received a packet that the protocol does not allow at that point (an emulator bug or misuse)."""


class ResourceExhausted(FabricError):
    """A finite switch resource ran out (e.g. NVSwitch gen 3's 128 concurrent multicast/SHARP groups)."""


class LinkDown(FabricError):
    """An operation needs a link that is down in the fault plan (fabric.faults) and no path is left around
    it. Attributes: link (its name), at_ns (when it went down, modeled ns), up_at_ns (when it comes back; inf:
    never). Raised again from a switch's refusal, it keeps its message (the attributes take their defaults)."""

    def __init__(self, message: str, link: str = "", at_ns: float = 0.0, up_at_ns: float = float("inf")):
        super().__init__(message)
        self.link, self.at_ns, self.up_at_ns = link, at_ns, up_at_ns


class PlanError(FabricError):
    """A collective plan (fabric.plans) is invalid; the message names the GPU, the step and the chunk.
    Raised by the validator or a loader, before anything runs."""
