"""Helpers that several benchmarks share and the package does not have (statistics come from the package).

Import as ``from benchmarks._common import …`` (the scripts put the repository root on ``sys.path``).
"""

from __future__ import annotations

from typing import Any


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


def probe_model(path: str, haystack_tokens: int = 200_000) -> tuple[Any, Any]:
    """A model loaded for a probe (CPU, one thread) and a stdlib haystack in its tokenizer.

    The sweep's probes (``benchmarks/mix_sweep``) score samples built the way ``qeval.py`` builds them.

    Returns:
        The :class:`ctxext.models.load.LoadedModel` (named after the folder) and the haystack.
    """
    from pathlib import Path

    import torch

    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack

    torch.set_num_threads(1)
    loaded = load_model(ModelSpec(path, name=Path(path).name), device="cpu")
    return loaded, Haystack.from_texts(
        loaded.tokenizer, iter_texts("builtin:stdlib"), haystack_tokens, "builtin:stdlib"
    )


def stdlib_documents(tokenizer: Any, min_tokens: int, count: int = 32) -> list[Any]:
    """The first ``count`` stdlib documents of at least ``min_tokens`` tokens (``qeval.py``'s perplexity documents)."""
    from ctxext.scoring.documents import tokenize_documents
    from ctxext.scoring.texts import iter_texts

    return tokenize_documents(iter_texts("builtin:stdlib"), tokenizer, min_tokens, count).ids


def document_nll(model: Any, documents: list[Any], length: int) -> Any:
    """Per-token NLL of the first ``length`` tokens of each document: a ``[documents, length - 1]`` tensor."""
    import torch

    from ctxext.scoring.nll import token_nll

    return torch.stack([token_nll(model, d[:length].unsqueeze(0))[0] for d in documents])


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
    """The demo's fine-tune (``ctxext/resources/recipes/demo.yaml``) with a benchmark arm's settings as overrides.

    Args:
        run_dir: the run's ``output.dir``.
        overrides: further ``key=value`` (applied last).
        original: the model's window (the needle rows' shortest length).
        factor: ``rope.target_length`` is ``original × factor``.
        steps: optimizer steps; warmup, eval and save cadence scale with them (steps/20, /4, /2) as in the
            demo's recipe (240 steps: 12, 60, 120).
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
