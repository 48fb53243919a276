"""Helpers that several benchmarks share and the package does not have (statistics come from the package).

Import as ``from benchmarks._common import …``; the benchmarks run as ``python -m benchmarks.NAME`` from the
repository root, so this checkout's ``ctxext`` and ``benchmarks`` are the ones imported.
"""

from __future__ import annotations

from typing import Any


def measured_on() -> str:
    """A result page's line saying when and where it was measured: ``Date: … UTC. Machine: …``."""
    import os
    import platform
    from datetime import datetime, timezone
    from importlib.metadata import version

    from benchmarks._memory import mem_total_gb

    return (
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()} CPU, "
        f"{os.cpu_count()} cores, {mem_total_gb():.0f} GB RAM; torch {version('torch')}, "
        f"transformers {version('transformers')}."
    )


def mcnemar_vs_reference(a: list[int], b: list[int]) -> dict[str, Any]:
    """Exact two-sided McNemar test of a model's 0/1 outcomes ``a`` against the reference's ``b``, trial for trial.

    :func:`ctxext.scoring.stats.mcnemar_exact` computes it; this keeps the keys the benchmarks' results
    were written with.

    Returns:
        ``only_this`` (``a`` right, ``b`` wrong), ``only_reference`` and ``p_value``.
    """
    from ctxext.scoring.stats import mcnemar_exact

    test = mcnemar_exact([bool(x) for x in a], [bool(y) for y in b])
    return {"only_this": test["only_a"], "only_reference": test["only_b"], "p_value": test["p_value"]}


def demo_recipe(
    run_dir: Any,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    original: int = 64,
    factor: int = 4,
    steps: int | None = None,
    plain: bool = False,
    pose_factor: int | None = None,
    task_weight: float | None = None,
    multikey_share: float = 0.0,
) -> Any:
    """The demo's fine-tune (``recipes/default.yaml``) with a benchmark arm's settings as overrides.

    Args:
        run_dir: the run's ``output.dir``.
        overrides: further ``key=value`` (applied last).
        original: the model's window (the needle rows' shortest length).
        factor: ``rope.target_length`` is ``original × factor``.
        steps: a fixed number of optimizer steps, without the recipe's adaptive stop (``train.probe``); warmup,
            eval and save cadence scale with them (steps/20, /4, /2). ``None``: the recipe's probe and ceiling.
        plain: the demo's ``--plain`` (training-split code alone).
        pose_factor: PoSE rows of ``pose_factor × original`` tokens (2 chunks).
        task_weight: share of task rows (default: the recipe's); ``multikey_share`` of them are multi-key rows
            (2 distractors), the rest single-key needle rows.
        multikey_share: see ``task_weight``.

    Returns:
        The validated recipe.
    """
    import json

    from ctxext.cli.demo import PLAIN, RECIPE
    from ctxext.recipe.schema import load_recipe

    target = original * factor
    given = [f"rope.target_length={target}", f"output.dir={run_dir}"]
    if steps is not None:
        given += [f"train.max_steps={steps}", f"train.warmup_steps={max(1, steps // 20)}"]
        given += [f"train.eval_every={max(5, steps // 4)}", f"train.save_every={max(1, steps // 2)}"]
        given.append("train.probe=null")  # an arm of fixed length: its step count is what it measures
    if plain:
        given += list(PLAIN)
    else:
        if task_weight is None:
            task_weight = sum(s.weight for s in load_recipe(RECIPE).data.mixture or [] if s.task)
        multikey = task_weight * multikey_share
        mixture: list[dict[str, Any]] = [
            {"path": "builtin:stdlib", "weight": 1.0 - task_weight},
            {"task": "needle", "weight": task_weight - multikey, "min_length": original, "templates": [0, 1, 2]},
        ]
        if multikey > 0:
            mixture.append(
                {
                    "task": "multikey",
                    "weight": multikey,
                    "distractors": 2,
                    "min_length": 2 * original,
                    "templates": [0, 1, 2],
                }
            )
        given.append(f"data.mixture={json.dumps(mixture)}")
        if pose_factor is not None:
            given += [f"train.seq_len={min(target, pose_factor * original)}", "train.pose.chunks=2"]
    return load_recipe(RECIPE, [*given, *overrides])
