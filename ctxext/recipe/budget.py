"""Time budgets written as durations: ``90s``, ``10m``, ``1h`` (or plain seconds)."""

from __future__ import annotations

import math
import re

from ctxext.errors import InputError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_budget(text: str | float | int) -> float:
    """Seconds of a time budget: ``90s``, ``10m``, ``1h``, ``1.5h`` or a plain number of seconds.

    Raises:
        InputError: not a duration, or not positive.
    """
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = re.fullmatch(r"\s*([-+]?\d+(?:\.\d*)?)\s*(s|m|min|h)?\s*", str(text))
        if not match:
            raise InputError(f"budget {text!r} is not a duration; write e.g. 90s, 10m or 1h")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or ""]
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(f"budget {text!r} must be a positive duration (e.g. 90s, 10m, 1h)")
    return seconds
