"""The adaptive stop's inputs (``train.probe``): the key sets it scores, and the base's in-window key forms.

Built once, before the first step, from the training data's held-out *validation* documents (never the evaluation's
held-out files). :mod:`ctxext.training.probe` says why the probe asks in the forms and at the depths it does.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from ctxext.errors import InputError
from ctxext.recipe.schema import Recipe

# The probe's filler: as much validation text as the evaluation's haystack reads (200k tokens). The text before a
# needle decides how hard it is to copy: a filler of four probe lengths (what the probe read before) was two files of
# the held-out base's 20 validation documents, and its keys right before the question were retrieved 32 of 32 times
# where the whole split's were 80 of 100 (the evaluation: 82 %).
HAYSTACK_TOKENS = 200_000


@dataclass
class ProbeInputs:
    """The probe's key sets: token ids and, for each, its answers' spans, needle depths (0–1) and key form."""

    sequences: list[list[int]]
    spans: list[list[tuple[int, int]]]
    length: int
    depths: list[list[float]] = field(default_factory=list)
    forms: list[int] = field(default_factory=list)
    window_forms: list[dict[str, Any]] | None = None
    window: int | None = None
    window_seconds: float = 0.0
    grid: list[float] | None = None
    filler: int = 0

    @property
    def trials(self) -> int:
        """Answers scored per probe."""
        return sum(len(s) for s in self.spans)

    def forms_line(self) -> str | None:
        """What the in-window check found and which forms the probe asks in (None without the check)."""
        from ctxext.tasks.forms import FormCheck, kept_templates, summarize

        if self.window_forms is None:
            return None
        checks = [FormCheck(**c) for c in self.window_forms]
        kept = kept_templates(checks)
        asked = ", ".join(str(f) for f in kept or [c.template for c in checks])
        why = "" if kept else " (none is retrieved there: the probe asks in every training form)"
        return (
            f"probe: key forms the base retrieves inside its {self.window}-token window: {summarize(checks)} "
            f"({self.window_seconds:.1f} s); the probe asks in form(s) {asked}{why}"
        )


def probe_inputs_for(recipe: Recipe, loaded: Any, documents: Any, accelerator: Any) -> ProbeInputs:
    """The probe's key sets in the forms it asks in: with ``train.probe.forms: window``, the base's in-window ones.

    A base that retrieves none of the training forms in its window is asked in all of them (what ``trained`` does).
    """
    from ctxext.tasks.forms import describe, kept_templates

    probe, length, window = recipe.train.probe, recipe.probe_length, original_window(loaded)
    assert probe is not None and length is not None
    filler = _validation_haystack(loaded.tokenizer, documents, length)
    # One tokenization of the validation text for both: their fillers are the same below 50k-token probes.
    window_filler = filler
    if probe.forms == "window" and _filler_tokens(window) != _filler_tokens(length):
        window_filler = _validation_haystack(loaded.tokenizer, documents, window)
    t0 = time.perf_counter()
    checks = check_window_forms(recipe, loaded, window_filler, accelerator)
    seconds = time.perf_counter() - t0
    templates = kept_templates(checks) if checks else None
    inputs = build_probe_inputs(recipe, loaded.tokenizer, documents, templates=templates, haystack=filler)
    if checks is not None:
        inputs.window_forms, inputs.window_seconds = describe(checks), seconds
        inputs.window = window
    return inputs


def original_window(loaded: Any) -> int:
    """The base's own window: what the extension's plan is relative to (the config's, when nothing was extended)."""
    from ctxext.rope.read import read_rope

    return loaded.plan.original_length if loaded.plan is not None else read_rope(loaded.model.config).original_length


def _validation_haystack(tokenizer: Any, documents: Any, length: int) -> Any:
    """The probe's filler: the training data's held-out validation documents, up to :data:`HAYSTACK_TOKENS` of them.

    Raises:
        InputError: there are none.
    """
    from ctxext.tasks.base import Haystack

    if documents is None or len(documents) == 0:
        raise InputError(
            "train.probe: the data has no held-out validation documents to probe on; raise data.validation_fraction"
        )
    return Haystack.from_texts(tokenizer, iter(documents["text"]), min_tokens=_filler_tokens(length), name="validation")


def _filler_tokens(length: int) -> int:
    """How much validation text a filler for ``length``-token inputs reads."""
    return max(4 * length, HAYSTACK_TOKENS)


def build_probe_inputs(
    recipe: Recipe, tokenizer: Any, documents: Any, templates: list[int] | None = None, haystack: Any = None
) -> ProbeInputs:
    """The probe's key sets, from the held-out validation documents, seeded by ``train.seed``.

    Args:
        recipe: the recipe (its ``train.probe`` is set).
        tokenizer: the model's tokenizer.
        documents: the training data's held-out raw documents (a Dataset with a ``text`` column), or ``None``.
        templates: the key forms to ask in (default: every training form,
            :meth:`ctxext.recipe.schema.Recipe.probe_forms`).
        haystack: the filler, when the caller has read it already (default: read from ``documents``).

    Raises:
        InputError: no held-out documents, or a probe too short for its keys.
    """
    from ctxext.tasks.keyset import make_keyset, spread_depths

    probe, length = recipe.train.probe, recipe.probe_length
    assert probe is not None and length is not None
    if haystack is None:
        haystack = _validation_haystack(tokenizer, documents, length)
    templates = templates or recipe.probe_forms()
    rng = random.Random(f"ctxext-probe-{recipe.train.seed}")
    sequences, spans, depth_lists, forms = [], [], [], []
    inputs = math.ceil(probe.trials / probe.keys)
    grid = depth_grid(probe.depths)
    for j in range(inputs):
        k = min(probe.keys, probe.trials - j * probe.keys)
        if grid:  # key g of the probe at grid depth g mod the grid's size: every depth as often as the others
            depths = [grid[(j * probe.keys + i) % len(grid)] for i in range(k)]
        else:
            # Shifted from input to input: with one key per input, every input's needle at the same depth would
            # probe one depth only, where the target asks for every depth.
            depths = spread_depths(k, j, inputs)
        forms.append(templates[j % len(templates)])
        try:
            keyset = make_keyset(tokenizer, haystack, length, depths, rng, template=forms[-1])
        except InputError as exc:
            raise InputError(f"train.probe: {exc}; lower train.probe.keys or raise train.probe.length") from None
        sequences.append(keyset.ids)
        spans.append(keyset.spans)
        depth_lists.append(keyset.depths)
    return ProbeInputs(sequences, spans, length, depth_lists, forms, grid=grid, filler=len(haystack.ids))


def depth_grid(depths: int | None) -> list[float] | None:
    """``depths`` depths evenly from 0 to 1 (both ends: the evaluation's 0 and 100 %), or None."""
    return [i / (depths - 1) for i in range(depths)] if depths else None


def check_window_forms(recipe: Recipe, loaded: Any, haystack: Any, accelerator: Any) -> list[Any] | None:
    """Which training key forms the base retrieves inside its own window (``train.probe.forms: window``).

    The model the run trains, before any step (its adapters add nothing yet), set back to its original RoPE for
    the check (:class:`ctxext.rope.runtime.RopeSnapshot`): the base's own skill. Each form is asked in key sets of
    one key at the window's length, from the held-out validation documents (seeded by ``train.seed``, apart from
    the probe's), until its decision is certain (:mod:`ctxext.tasks.forms`). The main process's decision is every
    process's.

    Args:
        recipe: the recipe (its ``train.probe`` is set).
        loaded: the :class:`ctxext.training.model.TrainingModel`.
        haystack: the filler read from the held-out validation documents.
        accelerator: the run's accelerator.

    Returns:
        One :class:`ctxext.tasks.forms.FormCheck` per training form; ``None`` with ``train.probe.forms: trained``.
    """
    from accelerate.utils import DistributedType

    from ctxext.rope.runtime import RopeSnapshot
    from ctxext.tasks.forms import PROBES_PER_DEPTH, WINDOW_DEPTHS, FormCheck, check_form
    from ctxext.tasks.keyset import make_keyset, spread_depths
    from ctxext.training.sequence_parallel import attention_unsplit

    probe = recipe.train.probe
    if probe is None or probe.forms == "trained":
        return None
    model, window = loaded.model, original_window(loaded)
    depths = [spread_depths(1, d, WINDOW_DEPTHS)[0] for d in range(WINDOW_DEPTHS)]
    answer_only = accelerator.distributed_type != DistributedType.FSDP
    checks: list[Any] = []
    extended = RopeSnapshot(model)
    was_training = model.training
    model.eval()
    try:
        if loaded.original_rope is not None:
            loaded.original_rope.apply(model)
        with attention_unsplit(model):
            for template in recipe.probe_forms():
                rng = random.Random(f"ctxext-probe-window-{recipe.train.seed}-{template}")
                try:
                    # Depth-major, as the check scores them: a depth's probes together.
                    sets = [
                        make_keyset(loaded.tokenizer, haystack, window, [depth], rng, template=template)
                        for depth in depths
                        for _ in range(PROBES_PER_DEPTH)
                    ]
                except InputError:  # the form's key and question do not fit in the window
                    checks.append(FormCheck(template, None, 0, False, PROBES_PER_DEPTH * len(depths)))
                    continue
                seqs, spans = [k.ids for k in sets], [k.spans[0] for k in sets]
                checks.append(check_form(model, template, seqs, spans, PROBES_PER_DEPTH, answer_only=answer_only))
    finally:
        extended.apply(model)
        model.train(was_training)
    if accelerator.num_processes > 1:  # one decision for every process
        from accelerate.utils import broadcast_object_list

        decided = [checks]
        broadcast_object_list(decided)
        checks = decided[0]
    return checks
