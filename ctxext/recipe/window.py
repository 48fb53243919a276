"""Lengths written as multiples of the model's window: ``4x`` is four times the context it was pretrained at.

A recipe whose lengths are multiples fits every base unchanged: ``rope.target_length: 4x`` extends a 64-token
model to 256 tokens and an 8,192-token one to 32,768. The fields that accept a multiple are marked where they
are declared (:func:`window_field`); :func:`resolve_window_multiples` turns each multiple into tokens before the
recipe is validated, reading the model's config only when a multiple is present (``model.original_length``
when the recipe gives it). A run folder's saved recipe holds the resolved token counts, so it reads the same
whatever base a later recipe names.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, Field

from ctxext.errors import InputError

# The json_schema_extra key that marks a field as accepting a multiple of the window.
MARK = "window_multiple"
_HELP = "or Nx: N × the model's original window, e.g. 4x"
# "4x", "0.5x", "4×", "4 x": a positive number, then x.
_MULTIPLE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*[x×]$", re.IGNORECASE)


def window_field(description: str = "", **kwargs: Any) -> Any:
    """A pydantic ``Field`` (token count) that the recipe may also give as a multiple of the model's window."""
    text = f"{description} ({_HELP})" if description else _HELP
    return Field(description=text, json_schema_extra={MARK: True}, **kwargs)


def multiple_of(value: Any) -> float | None:
    """The multiple a value states (``"4x"`` → 4.0), or ``None`` when it is not a multiple."""
    if not isinstance(value, str):
        return None
    match = _MULTIPLE.match(value.strip())
    return float(match.group(1)) if match else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    # The section model inside `X | None` or `list[X]`, if any.
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def window_keys(model: type[BaseModel], data: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, Any], str]]:
    """Every marked key present in ``data``: ``(dotted key, the dict holding it, its name there)``."""
    if not isinstance(data, dict):
        return
    for name, info in model.model_fields.items():
        if name not in data:
            continue
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get(MARK):
            yield f"{prefix}{name}", data, name
            continue
        sub = _model_in(info.annotation)
        value = data[name]
        if sub is None:
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                yield from window_keys(sub, item, f"{prefix}{name}.{i}.")
        else:
            yield from window_keys(sub, value, f"{prefix}{name}.")


def declared_window_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted keys that accept a multiple (a list's items as ``*``), for the docs and tests."""
    return marked_keys(model, MARK, prefix)


def marked_keys(model: type[BaseModel], mark: str, prefix: str = "") -> list[str]:
    """The dotted keys of the fields whose ``json_schema_extra`` carries ``mark`` (a list's items as ``*``)."""
    keys = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get(mark):
            keys.append(f"{prefix}{name}")
            continue
        sub = _model_in(info.annotation)
        if sub is not None:
            star = ".*" if typing.get_origin(info.annotation) is list or "list[" in str(info.annotation) else ""
            keys += marked_keys(sub, mark, f"{prefix}{name}{star}.")
    return keys


def model_window(data: dict[str, Any]) -> int:
    """The original (pretraining) window of the recipe's model: ``model.original_length``, else its config.

    Raises:
        InputError: no model is named, or its config cannot be read (the message says why).
    """
    from ctxext.models.sources import load_config
    from ctxext.rope.read import read_rope

    given_model = data.get("model")
    model: dict[str, Any] = given_model if isinstance(given_model, dict) else {}
    given = model.get("original_length")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given
    path = model.get("path")
    if not isinstance(path, str) or not path:
        raise InputError("set model.path (or model.original_length) so that the multiple has a window to multiply")
    config, _ = load_config(path, model.get("revision"), bool(model.get("trust_remote_code", False)))
    return int(read_rope(config).original_length)


def resolve_window_multiples(model: type[BaseModel], data: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """Replace every multiple of the window in ``data`` by its token count, in place.

    Args:
        model: the recipe model whose marked fields accept multiples.
        data: the recipe dict (overrides applied).

    Returns:
        ``(problems, resolved)``: ``(key, message)`` pairs for multiples that could not be resolved (left as
        given, so the validation names them again), and one line per resolved key (``rope.target_length: 4x
        of 64 = 256``).
    """
    found, problems = [], []
    for key, holder, name in window_keys(model, data):
        value = holder[name]
        if multiple_of(value) is not None:
            found.append((key, holder, name))
        elif isinstance(value, str) and not value.strip().isdigit():
            problems.append((key, f"{value!r} is neither a token count nor a multiple of the model's window (e.g. 4x)"))
    if problems or not found:
        return problems, []
    try:
        window = model_window(data)
    except InputError as exc:
        first = found[0]
        return [(first[0], f"{first[1][first[2]]!r} is a multiple of the model's window: {exc}")], []
    resolved = []
    for key, holder, name in found:
        given = holder[name]
        tokens = round(float(multiple_of(given) or 0) * window)
        if tokens < 1:
            problems.append((key, f"{given!r} of the model's {window}-token window is under a token: use a larger one"))
            continue
        holder[name] = tokens
        resolved.append(f"{key}: {given} of the model's {window}-token window = {tokens}")
    return problems, resolved
