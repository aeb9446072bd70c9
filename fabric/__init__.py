"""The fabric model: pure Python + numpy; never imports mpi4py.

What a workload script or a test needs, in one import:
`from nvlink_emu.fabric import preset, load_toml, AccessViolation, ...`.
"""

from .addressing import Handle
from .config import DEFAULT_PRESET, PRESETS, FabricConfig, load_toml, preset, resolve
from .errors import (AccessViolation, CollectiveMismatch, ConfigError, FabricError, FabricTimeout, OutOfMemory,
                     LinkDown, ProtocolError, ResourceExhausted, UnsupportedOperation)

__all__ = ["Handle", "DEFAULT_PRESET", "PRESETS", "FabricConfig", "load_toml", "preset", "resolve",
           "AccessViolation", "CollectiveMismatch", "ConfigError", "FabricError", "FabricTimeout", "OutOfMemory",
           "LinkDown", "ProtocolError", "ResourceExhausted", "UnsupportedOperation"]
