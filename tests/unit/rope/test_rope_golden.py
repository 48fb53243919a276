"""Every RoPE method, with every option set, plans exactly what it planned before methods became declarations.

``tests/data/rope_plans.json`` holds the plans (or errors) of the code before the method registry was
rebuilt from per-method declarations (``ctxext/rope/methods/``), regenerated with
``python tests/unit/rope/test_rope_golden.py tests/data/rope_plans.json``. It keeps data only: each plan's
``rope_parameters``, lengths, factor, rotary dimension and the parameters it composed on, and for a refused
plan the exception type and the settings it names (``RopeConfigError.problems`` keys). The plan's notes
and every message are prose: their wording may change without changing what a method plans, so they
are left out.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ctxext.rope.plan import apply_plan, plan_extension
from ctxext.rope.types import RopeError
from tests.helpers import ROOT
from tests.helpers.tiny import tiny_config

GOLDEN = ROOT / "tests" / "data" / "rope_plans.json"
D = 16
LONG = {"short_factor": [1.0] * (D // 2), "long_factor": [1.0 + i for i in range(D // 2)]}
CASES: dict[str, list[dict[str, Any]]] = {
    "linear": [{}, {"beta_fast": 3}],
    "ntk": [{}, {"alpha": 8}, {"alpha": 0.5}, {"alpha": 1}],
    "dynamic": [{}, {"factor": 2}, {"factor": 0.5}],
    "yarn": [
        {},
        {"beta_fast": 16, "beta_slow": 2},
        {"attention_factor": 1.2},
        {"truncate": False},
        {"truncate": True},
        {"beta_fast": 1, "beta_slow": 2},
        {"alpha": 2},
        {"beta_fast": 16, "attention_factor": 0.9, "truncate": False},
    ],
    "llama3": [{}, {"low_freq_factor": 2, "high_freq_factor": 8}, {"low_freq_factor": 4, "high_freq_factor": 2}],
    "theta": [{"rope_theta": 1e6}, {}, {"rope_theta": 100}],
    "longrope": [
        LONG,
        {**LONG, "attention_factor": 1.1},
        {"factors_file": "FILE"},
        {},
        {"short_factor": [1.0] * 3, "long_factor": [1.0] * 3},
        {"factors_file": "/nonexistent/factors.json"},
    ],
    "magic": [{}],
}


def _configs():
    yield "llama", tiny_config(), None
    yield "llama-partial-rotary", tiny_config(partial_rotary_factor=0.5), None
    ntk = tiny_config()
    apply_plan(ntk, plan_extension(ntk, "ntk", 512))
    yield "ntk512-original", ntk, "original"
    yield "ntk512-current", ntk, "current"
    linear = tiny_config()
    apply_plan(linear, plan_extension(linear, "linear", 512))
    yield "linear512-current", linear, "current"
    yield "linear512-original", linear, "original"


def records(factors_file: Path) -> list[dict[str, Any]]:
    """Plan (or the error) of every config × method × option set × target."""
    factors_file.write_text(json.dumps(LONG))
    out = []
    for name, config, relative_to in _configs():
        for method, option_sets in CASES.items():
            for options in option_sets:
                given = {k: str(factors_file) if v == "FILE" else v for k, v in options.items()}
                for target in (1024, 3000):
                    rec: dict[str, Any] = {
                        "config": name,
                        "method": method,
                        "options": options,
                        "target": target,
                        "relative_to": relative_to,
                    }
                    try:
                        plan = asdict(plan_extension(config, method, target, given, relative_to=relative_to))
                        rec["plan"] = {k: v for k, v in plan.items() if k != "notes"}
                    except RopeError as exc:
                        keys = sorted(getattr(exc, "problems", {}))
                        rec["error"] = {"type": type(exc).__name__, "keys": keys}
                    out.append(rec)
    return json.loads(json.dumps(out))


def test_every_method_plans_what_it_planned_before(tmp_path):
    expected = json.loads(GOLDEN.read_text())
    got = records(tmp_path / "factors.json")
    assert len(got) == len(expected) > 300
    for want, have in zip(expected, got, strict=True):
        assert have == want, f"{want['config']} {want['method']} {want['options']} → {want['target']}"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(sys.argv[1]).write_text(json.dumps(records(Path(tmp) / "factors.json"), indent=1) + "\n")
