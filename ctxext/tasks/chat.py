"""Chat templates around task prompts: ``auto`` (the tokenizer's own, if it has one), ``none``, or a Jinja file.

A chat model asked a long-context question without its template answers worse than it can (RULER ~0
from chat templates left out or doubled, base vs chat prompts); a base model wrapped in a template it
never saw answers worse too. So ``auto`` wraps only where the tokenizer carries a template and leaves base
models alone, and every report records which template was used.

The template is rendered once, around a placeholder user message, with the generation prompt
(``add_generation_prompt=True``); the text before and after the placeholder is tokenized without
special tokens (the template writes its own BOS, as ``apply_chat_template(tokenize=True)`` does). Prompts
are built in tokens, so the wrap is two token lists (:class:`~ctxext.tasks.base.ChatWrap`) put around the
prompt's tokens: exact lengths stay exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.tasks.base import ChatWrap, encode

CHAT_CHOICES = ("auto", "none")
# A user message no template alters (no whitespace to trim, no markup to escape).
_PLACEHOLDER = "CTXEXTUSERMESSAGE7f3a"


def check_chat_template(choice: str, where: str = "--chat-template") -> None:
    """Raise :class:`InputError` unless ``choice`` is ``auto``, ``none`` or an existing file."""
    if choice in CHAT_CHOICES:
        return
    if not Path(choice).is_file():
        raise InputError(
            f"{where} {choice!r}: use auto (the tokenizer's chat template, if it has one), none (plain prompts) "
            "or the path of a Jinja chat template file"
        )


def chat_wrap(tokenizer: Any, choice: str = "auto", where: str = "--chat-template") -> ChatWrap | None:
    """The tokens a chat template puts around a prompt, or None for a plain prompt.

    Args:
        tokenizer: the model's tokenizer.
        choice: ``auto`` (the tokenizer's ``chat_template`` if set, else plain), ``none``, or a Jinja file.
        where: the setting's name, for messages.

    Returns:
        The :class:`~ctxext.tasks.base.ChatWrap` (its ``source``: ``tokenizer`` or the file), or None.

    Raises:
        InputError: a missing file, or a template that does not render a user message once.
    """
    check_chat_template(choice, where)
    if choice == "none":
        return None
    if choice == "auto":
        if not getattr(tokenizer, "chat_template", None):
            return None
        template, source = None, "tokenizer"
    else:
        template, source = Path(choice).read_text(encoding="utf-8"), str(choice)
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": _PLACEHOLDER}],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception as exc:  # noqa: BLE001 — jinja's errors are many types; all mean "this template is broken"
        raise InputError(f"{where} {source}: the chat template does not render ({type(exc).__name__}: {exc})") from None
    if not isinstance(text, str) or text.count(_PLACEHOLDER) != 1:
        raise InputError(f"{where} {source}: the chat template must render the user's message exactly once")
    before, after = text.split(_PLACEHOLDER)
    return ChatWrap(head=encode(tokenizer, before), tail=encode(tokenizer, after), source=source)


def describe_chat(wrap: ChatWrap | None) -> str:
    """How prompts were formatted, for reports: ``none`` (plain) or the template's source."""
    return "none" if wrap is None else wrap.source
