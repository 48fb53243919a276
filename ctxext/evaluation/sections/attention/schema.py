"""The ``attention`` section's results in ``report.json``: attention mass by distance, beyond the window, on sinks."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ctxext.artifacts.report import Section


class Attention(Section):
    """The ``attention`` section: attention mass by distance band, beyond the original window, on sinks."""

    length: int
    documents: int
    original_length: int
    beyond_context: bool = False
    band_labels: list[str]
    layers: list[dict[str, Any]]
    mean: dict[str, Any]
    position_buckets: list[Any] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)
