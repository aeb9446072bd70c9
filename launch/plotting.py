"""What every `--plot FILE` option shares: the formats it writes and the check made before any rank starts."""

from pathlib import Path

from nvlink_emu.fabric.errors import ConfigError

PLOT_FORMATS = (".png", ".svg", ".pdf")


def check_plot(path: str) -> None:
    """ConfigError, before any rank starts, for a --plot file that cannot be written."""
    target = Path(path)
    if target.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(f"--plot {path}: name a {', '.join(PLOT_FORMATS[:-1])} or {PLOT_FORMATS[-1]} file")
    if target.is_dir():
        raise ConfigError(f"--plot {path}: is a directory")
    if not target.parent.is_dir():
        raise ConfigError(f"--plot {path}: {target.parent} is not a directory")
