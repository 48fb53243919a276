"""Chat templates around task prompts: ``auto`` (by what the model is), ``tokenizer``, ``none``, or a Jinja file.

A chat model asked a long-context question without its template answers worse than it can (RULER ~0 from chat
templates left out or doubled), and a base model wrapped in a template it never saw answers worse too (HELMET
runs base models without one). A tokenizer that carries a template does not make its model a chat model: many
base checkpoints ship one (Qwen2.5, Llama-3.1, SmolLM2 base). So ``auto`` asks what the model *is*:

    an instruct (chat) model is one whose generation stops at its template's end of turn — the first special
    token the template writes after an assistant's message (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``,
    ``</s>``) is one of the model's end-of-sequence tokens (the tokenizer's ``eos_token``, or ``eos_token_id``
    in ``config.json`` / ``generation_config.json``).

Instruct checkpoints are released that way, so that generation ends with the turn (SmolLM2-135M-Instruct:
``eos_token`` ``<|im_end|>``; Llama-3.1-Instruct: ``eos_token_id`` [128001, 128008, 128009]); their base
checkpoints stop at end-of-text while their templates end a turn with another token. The rule reads only the
tokenizer and the configs: no forward pass, the same answer every time, overridable (``tokenizer`` uses the
tokenizer's template on any model, ``none`` none). Every report records which template was used and why.

The template is rendered once, around a placeholder user message, with the generation prompt
(``add_generation_prompt=True``); the text before and after the placeholder is tokenized without
special tokens (the template writes its own BOS, as ``apply_chat_template(tokenize=True)`` does). Prompts
are built in tokens, so the wrap is two token lists (:class:`~ctxext.tasks.base.ChatWrap`) put around the
prompt's tokens: exact lengths stay exact. The answer prefix of a task's template then opens the assistant's turn.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.tasks.base import ChatWrap, encode

CHAT_CHOICES = ("auto", "tokenizer", "none")
CHAT_HELP = (
    "auto (the tokenizer's chat template for an instruct model, plain prompts for a base model), tokenizer (its "
    "chat template on any model), none (plain prompts), or a Jinja chat template file"
)
# Messages no template alters (no whitespace to trim, no markup to escape).
_USER = "CTXEXTUSERMESSAGE7f3a"
_ASSISTANT = "CTXEXTASSISTANTMESSAGE7f3a"
_SECOND = "CTXEXTSECONDUSERMESSAGE7f3a"


@dataclass(frozen=True)
class ChatDecision:
    """What ``auto`` resolved to for a comparison, decided once from one model and applied to every model.

    Attributes:
        use: ``tokenizer`` (each model's tokenizer's template) or ``none``.
        reason: why (the rule's finding on that model).
        model: the model it was decided from.
    """

    use: str
    reason: str
    model: str = ""


def check_chat_template(choice: str, where: str = "--chat-template") -> None:
    """Raise :class:`InputError` unless ``choice`` is ``auto``, ``tokenizer``, ``none`` or an existing file."""
    if choice in CHAT_CHOICES:
        return
    if not Path(choice).is_file():
        raise InputError(f"{where} {choice!r}: use {CHAT_HELP}")


def eos_ids(*sources: Any) -> set[int]:
    """The end-of-sequence token ids named by tokenizers, configs, generation configs or their JSON dicts."""
    ids: set[int] = set()
    for source in sources:
        value = source.get("eos_token_id") if isinstance(source, dict) else getattr(source, "eos_token_id", None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                ids.add(v)
    return ids


def _render(tokenizer: Any, messages: list[dict[str, str]], template: str | None, generation: bool) -> str:
    text = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=generation
    )
    if not isinstance(text, str):
        raise TypeError(f"the template rendered {type(text).__name__}, not text")
    return text


def end_of_turn(tokenizer: Any, template: str | None = None) -> list[int]:
    """The tokens the template writes after an assistant's message, up to its first special token (its end of turn).

    Empty when the template writes nothing there or cannot render a user and an assistant message.
    """
    try:
        messages = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        text = _render(tokenizer, messages, template, False)
    except Exception:  # noqa: BLE001 — jinja's errors are many types; a template that cannot say has no end of turn
        return []
    if text.count(_ASSISTANT) != 1:
        return []
    ids = encode(tokenizer, text.split(_ASSISTANT, 1)[1])
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(
        getattr(tokenizer, "added_tokens_decoder", {}) or {}
    )
    first = next((i for i, t in enumerate(ids) if t in special), None)
    return ids if first is None else ids[: first + 1]


def auto_choice(tokenizer: Any, model_eos: Iterable[int]) -> tuple[str, str]:
    """``auto``'s rule (the module's docstring): ``("tokenizer" | "none", why)`` for a tokenizer and its EOS ids.

    Args:
        tokenizer: the model's tokenizer.
        model_eos: the model's end-of-sequence ids (:func:`eos_ids` of its tokenizer and configs).
    """
    if not getattr(tokenizer, "chat_template", None):
        return "none", "a base model: its tokenizer has no chat template"
    end = end_of_turn(tokenizer)
    stops = set(model_eos)
    name = tokenizer.convert_ids_to_tokens(end[-1]) if end else None
    if end and end[-1] in stops:
        return "tokenizer", f"an instruct model: its generation stops at the chat template's end of turn {name}"
    stop_names = ", ".join(sorted(str(tokenizer.convert_ids_to_tokens(i)) for i in stops)) or "no token"
    ends = f"its template ends a turn with {name}" if name else "its template writes no end of turn"
    return "none", (
        f"a base model: its tokenizer has a chat template, but its generation stops at {stop_names} and {ends} "
        "(--chat-template tokenizer uses the template anyway)"
    )


def chat_wrap(
    tokenizer: Any,
    choice: str = "auto",
    where: str = "--chat-template",
    model_eos: Iterable[int] = (),
    decided: ChatDecision | None = None,
) -> ChatWrap | None:
    """The tokens a chat template puts around a prompt, or None for a plain prompt (:func:`chat_format`, no reason)."""
    return chat_format(tokenizer, choice, where, model_eos, decided)[0]


def chat_format(
    tokenizer: Any,
    choice: str = "auto",
    where: str = "--chat-template",
    model_eos: Iterable[int] = (),
    decided: ChatDecision | None = None,
) -> tuple[ChatWrap | None, str]:
    """The tokens a chat template puts around a prompt (None for a plain prompt), and why.

    Args:
        tokenizer: the model's tokenizer.
        choice: ``auto`` (by :func:`auto_choice`, or ``decided``), ``tokenizer`` (its ``chat_template``), ``none``,
            or a Jinja file.
        where: the setting's name, for messages.
        model_eos: the model's end-of-sequence ids (for ``auto``: :func:`eos_ids` of its configs; the
            tokenizer's own are always included).
        decided: ``auto`` decided once for a comparison (from its reference model): every model follows it.

    Returns:
        ``(wrap, reason)``: the :class:`~ctxext.tasks.base.ChatWrap` (its ``source``: ``tokenizer`` or the file) or
        None, and the reason recorded in reports (``auto: an instruct model: …``, ``asked for``).

    Raises:
        InputError: a missing file, a template that does not render a user message once, or ``tokenizer`` (asked
            for or decided) for a tokenizer without a template.
    """
    check_chat_template(choice, where)
    use, reason = chat_reason(tokenizer, choice, model_eos, decided)
    if use == "none":
        return None, reason
    if use == "tokenizer":
        if not getattr(tokenizer, "chat_template", None):
            model = f" (decided from {decided.model})" if decided is not None and choice == "auto" else ""
            raise InputError(
                f"{where} {choice}: the prompts use the tokenizer's chat template{model}, but this model's tokenizer "
                "has none: pass none (plain prompts) or a Jinja chat template file"
            )
        template, source = None, "tokenizer"
    else:
        template, source = Path(use).read_text(encoding="utf-8"), str(use)
    try:
        text = _render(tokenizer, [{"role": "user", "content": _USER}], template, True)
    except Exception as exc:  # noqa: BLE001 — jinja's errors are many types; all mean "this template is broken"
        raise InputError(f"{where} {source}: the chat template does not render ({type(exc).__name__}: {exc})") from None
    if text.count(_USER) != 1:
        raise InputError(f"{where} {source}: the chat template must render the user's message exactly once")
    before, after = text.split(_USER)
    wrap = ChatWrap(
        head=encode(tokenizer, before),
        tail=encode(tokenizer, after),
        source=source,
        end=end_of_turn(tokenizer, template),
        turn=_turn(tokenizer, template, before, after),
        reason=reason,
    )
    return wrap, reason


def chat_reason(
    tokenizer: Any, choice: str, model_eos: Iterable[int] = (), decided: ChatDecision | None = None
) -> tuple[str, str]:
    """``(what is used, why)``: ``none``, ``tokenizer`` or the file, for a choice (``auto`` decided here or before)."""
    if choice == "auto":
        if decided is not None:
            by = f" (for every model, decided from {decided.model})" if decided.model else ""
            return decided.use, f"auto: {decided.reason}{by}"
        use, why = auto_choice(tokenizer, set(model_eos) | eos_ids(tokenizer))
        return use, f"auto: {why}"
    return choice, "asked for"


def _turn(tokenizer: Any, template: str | None, head: str, tail: str) -> list[int] | None:
    """The tokens between an assistant's message and the next user message (if a second turn renders like the first)."""
    messages = [
        {"role": "user", "content": _USER},
        {"role": "assistant", "content": _ASSISTANT},
        {"role": "user", "content": _SECOND},
    ]
    try:
        text = _render(tokenizer, messages, template, True)
    except Exception:  # noqa: BLE001 — a template that cannot render a conversation has no turns to offer
        return None
    if text.count(_USER) != 1 or text.count(_ASSISTANT) != 1 or text.count(_SECOND) != 1:
        return None
    first, rest = text.split(_USER)
    middle, rest = rest.split(_ASSISTANT)
    between, last = rest.split(_SECOND)
    if first != head or middle != tail or last != tail:
        return None
    return encode(tokenizer, between)


def describe_chat(wrap: ChatWrap | None) -> str:
    """How prompts were formatted, for reports: ``none`` (plain) or the template's source."""
    return "none" if wrap is None else wrap.source
