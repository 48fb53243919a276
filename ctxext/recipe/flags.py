"""The method-option flags of ``ctxext extend``, generated from the method declarations (``ctxext/rope/methods/``).

Each declared option becomes one flag (``beta_fast`` → ``--beta-fast``; a ``bool`` option →
``--truncate/--no-truncate``; a list → comma-separated numbers or a JSON list). The flags are built when
the command is, so a method registered before the command line runs (a plugin module) gets its flags too.
The command receives the values that were given as ``ctx.meta[ROPE_OPTIONS]``.
"""

from __future__ import annotations

import inspect
import json
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperCommand

from ctxext.rope.methods import declared_options
from ctxext.rope.methods.base import Option

# Where the command finds the method options it was given.
ROPE_OPTIONS = "ctxext.rope_options"
_PANEL = "Method options (each for the methods named)"


def parse_list(text: str) -> list[Any]:
    """A list flag's value: numbers separated by commas (``1,1.2,1.5``) or a JSON list.

    Raises:
        typer.BadParameter: neither.
    """
    stripped = text.strip()
    try:
        value = json.loads(stripped if stripped.startswith("[") else f"[{stripped}]")
    except json.JSONDecodeError:
        raise typer.BadParameter(f"give numbers separated by commas (1,1.2,1.5) or a JSON list, got {text!r}") from None
    return list(value) if isinstance(value, list) else [value]


def _is_list(option: Option) -> bool:
    return option.type not in (bool, float, int, str)


def method_flags() -> list[Any]:
    """One typer option per declared option of every registered method, built by typer from a generated signature."""
    params, annotations = [], {}
    for name, shared in declared_options().items():
        option = shared.option
        decl = f"{option.flag}/--no-{option.flag[2:]}" if option.type is bool else option.flag
        kind = str if _is_list(option) else option.type
        metavar = "N,N,…" if _is_list(option) else None
        annotations[name] = Annotated[
            kind | None, typer.Option(decl, help=shared.help, rich_help_panel=_PANEL, metavar=metavar)
        ]
        keyword = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(name, keyword, default=None, annotation=annotations[name]))

    def flags(**_: Any) -> None:  # only its signature is read
        return None

    flags.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    flags.__annotations__ = annotations
    app = typer.Typer(add_completion=False)
    app.command()(flags)
    return [p for p in typer.main.get_command(app).params if p.name in annotations]


class MethodOptionsCommand(TyperCommand):
    """A typer command with the generated method-option flags; their values go to ``ctx.meta[ROPE_OPTIONS]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flags = method_flags()
        self._generated = {flag.name for flag in flags}
        self.params.extend(flags)

    def invoke(self, ctx: Any) -> Any:  # typer's click Context
        """Move the method options out of the typed parameters, then run the command."""
        declared = declared_options()
        given = {name: ctx.params.pop(name) for name in list(ctx.params) if name in self._generated}
        for name, value in given.items():
            if value is not None and _is_list(declared[name].option):
                try:
                    given[name] = parse_list(value)
                except typer.BadParameter as exc:
                    exc.param_hint = declared[name].option.flag
                    raise
        ctx.meta[ROPE_OPTIONS] = given
        return super().invoke(ctx)
