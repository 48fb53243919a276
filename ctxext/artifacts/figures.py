"""Saving the PNG plots of reports (``report.md``'s figures, the suite sections' own plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, folder: Path, name: str, tight: bool = True) -> str:
    """Save a figure as ``folder/name`` (110 dpi) and close it; returns ``name``."""
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name
