"""Addresses: classic NVLink's shared physical space and NVLink Network's per-GPU network addresses."""

import random
from dataclasses import dataclass

from .errors import AccessViolation

# Classic NVLink: one physical address space; the GPU index sits above a 1 TiB per-GPU aperture.
PHYSICAL_GPU_SHIFT = 40
PHYSICAL_OFFSET_MASK = (1 << PHYSICAL_GPU_SHIFT) - 1

# NVLink Network: each GPU's exported windows live in its own network-virtual space, from here up.
NETWORK_VIRTUAL_BASE = 0x7F00_0000_0000

# The network addresses the fabric manager hands out, one per GPU: a fabric holds at most MAX_GPUS GPUs.
NETWORK_ADDRESSES = range(0x100, 0x1000)
MAX_GPUS = len(NETWORK_ADDRESSES)  # 3840


def physical_address(gpu: int, offset: int) -> int:
    """Global physical address of byte `offset` of GPU `gpu` (classic mode)."""
    if not 0 <= offset <= PHYSICAL_OFFSET_MASK:
        raise AccessViolation(f"offset {offset:#x} of GPU {gpu} does not fit the {PHYSICAL_GPU_SHIFT}-bit aperture")
    return (gpu << PHYSICAL_GPU_SHIFT) | offset


def decode_physical(address: int, gpus: int) -> tuple[int, int]:
    """(gpu, offset) named by a classic global physical address; AccessViolation if no GPU owns it."""
    gpu, offset = address >> PHYSICAL_GPU_SHIFT, address & PHYSICAL_OFFSET_MASK
    if address < 0 or gpu >= gpus:
        raise AccessViolation(f"physical address {address:#x} names GPU {gpu}, but the fabric has "
                              f"GPUs 0..{gpus - 1}")
    return gpu, offset


def assign_network_addresses(gpus: int, seed: int = 0x4E564C) -> tuple[int, ...]:
    """Network addresses the fabric manager hands out at start: unique, deterministic, unrelated to rank."""
    pool = random.Random(seed).sample(NETWORK_ADDRESSES, gpus)
    return tuple(pool)


@dataclass(frozen=True)
class Handle:
    """An exported window, as a plain serialisable value: whom to reach and where, and how much.

    network_address: the owner GPU's network address; address: network-virtual byte address of the
    window's first byte; size_bytes: window length; owner: the owner's GPU index (for messages only,
    never used for routing).
    """

    network_address: int
    address: int
    size_bytes: int
    owner: int

    def __str__(self) -> str:
        return (f"window {self.network_address:#x}:{self.address:#x}+{self.size_bytes} "
                f"(GPU {self.owner})")
