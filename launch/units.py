"""Sizes for the command line and for people: parse_size reads '1024', '64K', '16M', '1G' (an
argparse type), format_bytes writes '512 B', '64 KiB', '1.5 MiB', '1 GiB'."""

import argparse

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def parse_size(text: str) -> int:
    """Bytes from '1024', '64K', '16M', '1G' (a trailing B allowed; ArgumentTypeError otherwise)."""
    units = {"K": KiB, "M": MiB, "G": GiB}
    clean = text.strip().upper().removesuffix("B")
    try:
        if clean and clean[-1] in units:
            return int(float(clean[:-1]) * units[clean[-1]])
        return int(clean)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (like 1024, 64K, 16M, 1G)") from None


def format_bytes(n: int) -> str:
    """A size for people: '512 B', '64 KiB', '1.5 MiB', '1 GiB'."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{round(n / unit, 2):g} {name}"
    return f"{n} B"
