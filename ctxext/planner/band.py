"""The plan's error band: how far measured peaks have been from the plan, and the band a plan is stated with.

A plan is a value with a band: ``[planned × (1 + LOW), planned × (1 + HIGH)]``, where LOW and HIGH are the
smallest and largest ``measured / planned − 1`` over the cells where ctxext's training step has been measured
against the plan (``benchmarks/results/plan_accuracy.md``; ``tests/unit/planner/test_plan_band.py`` re-predicts those
cells and checks that the band still covers them). A recipe *fits* when the band's upper end fits the device's usable
memory, and the longest length the plan reports is the longest whose upper end does.

Which cells: on a GPU the caching allocator's peak is the live tensors' peak (the allocator's own waste is the
plan's fragmentation term), so GPU plans take the band of the live-peak cells (glibc forced to return freed
memory: ``--force-mmap``); CPU plans, which are checked against the process's resident peak, take the band of the
resident-peak cells (glibc keeps freed heap memory there). No cell has been measured on a GPU: the CUDA terms
(context, fragmentation, flash-attention's buffers) are modelled, and ``scripts/gpu_check.py`` is what measures
them.
"""

from __future__ import annotations

from dataclasses import dataclass

# measured / planned − 1 over the cells of benchmarks/results/plan_accuracy.json, re-predicted with the current
# formulas (`python -m benchmarks.plan_accuracy --report-only`): (lowest, highest, cells).
# Rounded outward to whole percents; tests/unit/planner/test_plan_band.py checks that they still cover every cell.
LIVE_PEAK = (-0.15, 0.04, 12)  # the step's memory above the warm-up, glibc mmap forced (live peak)
RESIDENT_PEAK = (-0.12, 0.32, 40)  # the process's resident peak (glibc keeps freed heap memory)


@dataclass(frozen=True)
class Band:
    """A plan's band.

    Attributes:
        low: the band's lower end, bytes.
        high: its upper end, bytes (what must fit).
        rel_low: ``low / planned − 1``.
        rel_high: ``high / planned − 1``.
        cells: how many measured cells the band comes from.
        source: which cells (live or resident peak).
    """

    low: int
    high: int
    rel_low: float
    rel_high: float
    cells: int
    source: str

    def describe(self) -> str:
        """One line: the relative band and where it comes from."""
        return (
            f"{self.rel_low:+.0%}/{self.rel_high:+.0%}: measured/planned − 1 over {self.cells} measured CPU cells "
            f"({self.source})"
        )


def relative_band(kind: str) -> tuple[float, float, int, str]:
    """(low, high, cells, source) of the band for a device kind (``cuda`` or ``cpu``)."""
    if kind == "cuda":
        return (*LIVE_PEAK, "live peaks, benchmarks/results/plan_accuracy.md")
    return (*RESIDENT_PEAK, "resident peaks, benchmarks/results/plan_accuracy.md")


def band_of(planned: int, kind: str) -> Band:
    """The band of a planned peak on a device kind."""
    low, high, cells, source = relative_band(kind)
    low, high = min(low, 0.0), max(high, 0.0)  # the band contains the plan itself
    return Band(int(planned * (1 + low)), int(planned * (1 + high)), low, high, cells, source)
