"""A retrieval grid reports progress per forward pass, so one length of long trials is not silent until it ends."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from ctxext.models.builtin import GROWN_MK_DIR

pytestmark = pytest.mark.skipif(
    not (GROWN_MK_DIR / "model.safetensors").is_file(), reason="the multi-key grown model is not packaged"
)


def test_one_length_advances_the_progress_per_batch_of_each_scoring(monkeypatch):
    import ctxext.evaluation.sections.grids.engine as engine
    from ctxext.models.load import ModelSpec, load_model

    grown = load_model(ModelSpec("builtin:grown-code-64-mk"), device="cpu")
    haystack = engine.load_haystack(grown, "builtin:stdlib", "text", "test", 512)
    seen: list[tuple[float, float]] = []

    @contextmanager
    def recorder(description, total, **kwargs):
        done = [0.0]

        def advance(amount: float = 1) -> None:
            done[0] += amount
            seen.append((done[0], total))

        yield advance

    monkeypatch.setattr(engine, "progress", recorder)
    # 12 trials of 256 tokens in forward passes of 4 (1,024 tokens), scored both ways: 2 × 3 teacher-forced
    # batches and generation batches, each a step of progress, not one step at the end of the length.
    settings = engine.GridSettings(
        lengths=[256], depths=[50], trials=12, scoring="both", batch_tokens=1024, allow_beyond_context=True
    )
    grid = engine.evaluate_task_grid(grown, settings, "needle", haystack, 0, None, True)
    assert grid["cells"][0]["trials"] == 12
    assert seen[-1] == (24, 24) and len(seen) >= 4, seen
    assert seen[0][0] < 24  # progress before the length's last trial was scored
