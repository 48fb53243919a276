"""LongRoPE (Ding et al. 2024): per-dimension rescale factors, one list for short and one for long sequences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxext.rope.methods.base import Option, RopeMethod, positive
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopeConfigError, RopePlan, RopeState


@register_method
class LongRope(RopeMethod):
    """Rope type ``longrope`` with the given (or searched: ``ctxext search``) factor lists."""

    name = "longrope"
    summary = "LongRoPE (Ding et al. 2024): per-dimension short/long rescale factors"
    order = 70
    options = (
        Option("short_factor", list[float], "rescale factors within the original context (rotary_dim/2 numbers)"),
        Option("long_factor", list[float], "rescale factors beyond the original context (rotary_dim/2 numbers)"),
        Option("factors_file", str, "JSON with short_factor and long_factor lists"),
        Option(
            "attention_factor", float, "override the attention scaling (default: the method's formula)", check=positive
        ),
    )

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """The factor lists (from the options or ``factors_file``), ``factor = s`` and the original length."""
        short, long_ = opts.get("short_factor"), opts.get("long_factor")
        if opts.get("factors_file"):
            short, long_ = load_factors_file(opts["factors_file"])
        if short is None or long_ is None:
            raise RopeConfigError(
                {
                    "long_factor": "longrope needs short_factor and long_factor lists "
                    f"({state.rotary_dim // 2} numbers each), e.g. --factors-file factors.json"
                }
            )
        # LongRoPE's factors divide frequencies: below 1 a dimension turns faster than in pretraining, which no
        # extension wants (ctxext search keeps them >= 1 too). Checked here, for plans ctxext makes; a released
        # config is only read.
        below = {k: min(v) for k, v in (("short_factor", short), ("long_factor", long_)) if v and min(v) < 1}
        if below:
            raise RopeConfigError(
                {
                    k: f"every rescale factor must be >= 1 (a factor below 1 shortens a wavelength), got {m:g}"
                    for k, m in below.items()
                }
            )
        params = {
            "rope_type": "longrope",
            "factor": s,
            "short_factor": [float(v) for v in short],
            "long_factor": [float(v) for v in long_],
            "original_max_position_embeddings": state.original_length,
            **self.base_parameters(state),
        }
        if opts.get("attention_factor") is not None:
            params["attention_factor"] = float(opts["attention_factor"])
        return self.make_plan(state, target, s, params, target)


def load_factors_file(path: str | Path) -> tuple[list[float], list[float]]:
    """Read LongRoPE rescale factors from a JSON file ``{"short_factor": [...], "long_factor": [...]}``.

    Args:
        path: the JSON file.

    Returns:
        ``(short_factor, long_factor)``.

    Raises:
        RopeConfigError: the file is missing, not JSON, or lacks a key.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RopeConfigError({"factors_file": f"{path} does not exist"}) from None
    except json.JSONDecodeError as exc:
        raise RopeConfigError({"factors_file": f"{path} is not valid JSON: {exc}"}) from None
    except UnicodeDecodeError:
        raise RopeConfigError({"factors_file": f"{path} is not UTF-8 text; give the factors' JSON file"}) from None
    except OSError as exc:
        raise RopeConfigError({"factors_file": f"{path} cannot be read ({exc.strerror or exc})"}) from None
    if not isinstance(data, dict):
        raise RopeConfigError(
            {"factors_file": f"{path} must hold a JSON object with short_factor and long_factor lists"}
        )
    missing = [k for k in ("short_factor", "long_factor") if k not in data]
    if missing:
        raise RopeConfigError({"factors_file": f"{path} lacks {', '.join(missing)}"})
    return list(data["short_factor"]), list(data["long_factor"])
