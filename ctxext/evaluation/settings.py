"""What every suite section's settings share: lengths, the chat-template choice, the scoring modes.

Each section declares its own settings model in its folder (``sections/<name>/settings.py``); the fields
they have in common are declared here once, so ``2x`` or ``auto`` mean the same in every section. Length
resolution itself is :mod:`ctxext.evaluation.lengths`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationInfo

from ctxext.errors import InputError
from ctxext.evaluation.lengths import Length, resolve_length

Scoring = Literal["teacher-forced", "generate", "both"]
CHAT_HELP = (
    "auto (the tokenizer's chat template for an instruct model, plain prompts for a base model; decided once per "
    "comparison), tokenizer, none, or a Jinja chat template file"
)
# The default lengths of every evaluation (typed: a bare lambda's list literal would be inferred as list[str]).
DEFAULT_LENGTHS: list[Length] = ["1x", "2x", "4x"]
# A bootstrap interval over one or two documents has (almost) zero width and means nothing.
MIN_DOCS = 3


def check_chat_choice(value: str, info: ValidationInfo | None = None) -> str:
    """A ``chat_template`` setting's value, checked where it is declared (so flags and suite keys fail alike).

    A suite passes its folders as validation context (``{"folders": [...]}``): a template file may be relative to
    the working folder or to them, as every path in a suite may.
    """
    from ctxext.tasks.chat import CHAT_CHOICES

    folders = [Path(f) for f in ((info.context or {}).get("folders", []) if info is not None else [])]
    if value not in CHAT_CHOICES and not any((f / value).is_file() for f in [Path("."), *folders]):
        raise ValueError(
            f"{value!r}: use auto (the tokenizer's chat template for an instruct model, plain prompts for a base "
            "model), tokenizer (its chat template on any model), none (plain prompts) or the path of a Jinja chat "
            "template file"
        )
    return value


def decide_chat(ref: str, label: str | None = None) -> Any:
    """``auto``'s chat template decided once, from one model's tokenizer and configs, for every model of a run.

    Paired trials need identical prompts, so a comparison formats every model's prompts the way its reference
    model needs (:func:`ctxext.tasks.chat.auto_choice`); weights are not read.

    Args:
        ref: the model (folder, ``builtin:NAME``, Hub id or run folder).
        label: its name in the report, which the reason names (``""``: not named, a run of one model).

    Returns:
        The :class:`~ctxext.tasks.chat.ChatDecision`.
    """
    import json

    from ctxext.artifacts.run import is_run_folder, run_base_model
    from ctxext.models.load import load_tokenizer_and_config
    from ctxext.models.sources import load_config
    from ctxext.tasks.chat import ChatDecision, auto_choice, eos_ids

    tokenizer, config = load_tokenizer_and_config(ref)
    folder = load_config(run_base_model(ref) if is_run_folder(ref) else ref)[1]
    generation: dict[str, Any] = {}
    path = Path(folder) / "generation_config.json"
    if path.is_file():
        try:
            generation = json.loads(path.read_text())
        except (OSError, ValueError):  # an unreadable generation config names no stop token
            generation = {}
    use, reason = auto_choice(tokenizer, eos_ids(tokenizer, config, generation))
    return ChatDecision(use, reason, ref if label is None else label)


def checked_lengths(values: list[Length]) -> list[Length]:
    """A field validator's check: every length is a token count or a relative length."""
    for value in values:
        try:
            resolve_length(value, 1, 1)
        except InputError as exc:
            raise ValueError(str(exc)) from None
    return values
