"""Progress on long work, for a person at a terminal and for a log file alike: the one progress display.

On a terminal (stderr is a TTY) a rich bar with the count, a free-text field, elapsed time and ETA is drawn on
stderr. Otherwise (a log file, a scheduler, a pipe) nothing is redrawn: a plain line goes to stderr every ``every``
units (when given) and at least every ``interval_s`` seconds of work, and a last one when work that printed a line
ends, e.g. ``train: step 40/240 (17 %) · loss 2.31 lr 2.0e-04 1,234 tok/s · 1m02s elapsed, ETA 5m10s``. Work
shorter than ``interval_s`` prints nothing. Lines go to stderr so that a command's own output on stdout (a table,
``--json``) stays clean; a scheduler's log or ``2>&1`` collects them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def duration(seconds: float) -> str:
    """A duration as people read it: ``45s``, ``3m05s``, ``2h10m``."""
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Tracker:
    """Advance or set the progress of one piece of work; calling it advances by ``amount``."""

    def __init__(self, description: str, total: float, unit: str, every: float | None, interval_s: float):
        self.description, self.total, self.unit = description, total, unit
        self.every, self.interval_s = every, interval_s
        self.completed = 0.0
        self.info = ""
        self._start = self._last_line = time.monotonic()
        self._last_at = 0.0
        # Units done before this process started (a resumed run): the ETA's rate counts only the units done here.
        self._initial = 0.0
        self._bar: Any = None
        self._task: Any = None
        self.lines = 0

    def __call__(self, amount: float = 1) -> None:
        """Advance by ``amount`` units."""
        self.update(self.completed + amount)

    def update(self, completed: float, info: str | None = None, description: str | None = None) -> None:
        """Set the units done so far (and the free-text field, and the description)."""
        self.completed = completed
        if info is not None:
            self.info = info
        if description is not None:
            self.description = description
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, info=self.info, description=self.description)
            return
        now = time.monotonic()
        due_by_count = self.every is not None and completed - self._last_at >= self.every
        if due_by_count or now - self._last_line >= self.interval_s:
            self._line(now)

    def _line(self, now: float) -> None:
        self._last_line, self._last_at = now, self.completed
        self.lines += 1
        elapsed = now - self._start
        share = self.completed / self.total if self.total else 1.0
        unit = f"{self.unit} " if self.unit else ""
        text = f"{self.description}: {unit}{self.completed:g}/{self.total:g} ({100 * share:.0f} %)"
        if self.info:
            text += f" · {self.info}"
        text += f" · {duration(elapsed)} elapsed"
        done_here = self.completed - self._initial
        if 0 < share < 1 and done_here > 0:
            text += f", ETA {duration(elapsed * (self.total - self.completed) / done_here)}"
        print(text, file=sys.stderr, flush=True)


@contextmanager
def progress(
    description: str,
    total: float,
    *,
    enabled: bool = True,
    unit: str = "",
    every: float | None = None,
    interval_s: float = 30.0,
    completed: float = 0,
) -> Iterator[Tracker]:
    """Show the progress of one piece of work.

    Args:
        description: what is being done (``train``, ``answers model-a``).
        total: units of work.
        enabled: show anything at all (e.g. only on the main process).
        unit: the unit's name in the plain lines (``step``).
        every: without a terminal, a line every this many units (``None``: by time only).
        interval_s: without a terminal, a line at least this often.
        completed: units already done (a resumed run).

    Yields:
        A :class:`Tracker`.
    """
    tracker = Tracker(description, total, unit, every, interval_s)
    tracker.completed = tracker._last_at = tracker._initial = completed
    if not enabled:
        tracker.interval_s, tracker.every = float("inf"), None
        yield tracker
        return
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield tracker
        if tracker.lines and tracker.completed != tracker._last_at:
            tracker._line(time.monotonic())
        return
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    # Descriptions and info hold model names and paths: printed as they are, not read as rich markup.
    columns = (
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[info]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        tracker._bar, tracker._task = bar, bar.add_task(description, total=total, completed=int(completed), info="")
        yield tracker


__all__ = ["Tracker", "duration", "progress"]
