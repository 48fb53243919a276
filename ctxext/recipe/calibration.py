"""What ``ctxext calibrate`` measures and how it chooses: declared once, its flags and recipe keys generated from it.

:class:`CalibrationSettings` is the declaration ``ctxext calibrate``'s flags come from; :class:`CalibrateSection`
(the recipe's ``calibrate:`` keys) adds only *whether* ``ctxext train`` calibrates the run it has trained. Torch-free,
so building the command's flags imports nothing heavy (docs/settings.md).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ctxext.tasks.samples import check_depths


class CalibrationSettings(BaseModel):
    """What ``ctxext calibrate`` measures and how it chooses (each field is one ``--flag``)."""

    model_config = ConfigDict(extra="forbid")

    temperatures: list[float] = Field(
        default_factory=lambda: [1.0, 1.1, 1.2],
        min_length=1,
        description="candidate attention temperatures (1.0, the run as trained, is always measured)",
    )
    depths: list[float] = Field(
        default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0],
        min_length=1,
        description="needle depths in percent at the target length and in the window",
    )
    trials: int = Field(default=50, gt=0, description="needle trials per depth at the target length")
    window_trials: int = Field(default=10, gt=0, description="needle trials per depth inside the original window")
    windows: int = Field(
        default=64, gt=1, description="held-out windows of the original length for the in-window perplexity"
    )
    window_tolerance: float = Field(
        default=2.0,
        ge=0,
        lt=100,
        description="in-window perplexity increase a temperature may cost, percent (upper end of the paired 95% CI "
        "vs the run as trained); 0: only changes the CI cannot detect",
    )
    alpha: float = Field(default=0.05, gt=0, lt=1, description="significance of the paired retrieval tests")
    seed: int = Field(default=4321, description="seed of the trials (apart from ctxext eval's)")

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, value: list[float]) -> list[float]:
        bad = [t for t in value if not math.isfinite(t) or t <= 0]
        if bad:
            raise ValueError(f"{bad} are not positive numbers (1.0 means no temperature)")
        return sorted({1.0, *value})

    @field_validator("depths")
    @classmethod
    def _percent(cls, value: list[float]) -> list[float]:
        return check_depths(value)


# Calibration after training by default when it is cheap: the share of the training loop's time it may take.
DEFAULT_MAX_SHARE = 10.0


class CalibrateSection(CalibrationSettings):
    """The recipe's ``calibrate:``: whether ``ctxext train`` calibrates the run's attention temperature at the end.

    ``auto`` (the default) calibrates when the measurement is estimated (from one timed forward) to take at most
    ``max_share`` percent of the training loop's time, and otherwise says so and names ``ctxext calibrate RUN``;
    the choice stays 1.0 unless a temperature is significantly better (docs/training.md), so a run that gains
    nothing is left as trained.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    when: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="auto: calibrate after training when it costs at most max_share of the training time; "
        "always; never (calibrate later with `ctxext calibrate RUN`)",
    )
    max_share: float = Field(
        default=DEFAULT_MAX_SHARE,
        gt=0,
        description="with when: auto, the most calibration may cost, percent of the time the training steps took",
    )
