"""PNG plots of an evaluation report: each suite section draws its own (:meth:`SuiteSection.plots`).

Every plot reads the report's JSON form (:meth:`ctxext.artifacts.report.EvalReport.to_json_dict`, NaN written
as null); matplotlib is imported only when plots are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(report: dict[str, Any], folder: Path) -> dict[str, str]:
    """Write the PNG plots that the report's data supports: every registered section's, for its models.

    Args:
        report: the report dict.
        folder: where to write.

    Returns:
        Plot name → file name.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctxext.evaluation.sections import SECTIONS

    written: dict[str, str] = {}
    for key, registered in SECTIONS.items():
        have = [m for m in report["models"] if m.get(key)]
        if have:
            written.update(registered.plots(plt, have, folder))
    return written
