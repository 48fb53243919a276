"""Command-line flags generated from declarations: RoPE method options and workflow settings models.

Two kinds of declaration become typer flags through one mechanism:

* the options of the RoPE methods (``ctxext/rope/methods/``): :class:`MethodOptionsCommand` gives
  ``ctxext extend`` one flag per declared option; the values given arrive as ``ctx.meta[ROPE_OPTIONS]``;
* a workflow's settings model (a pydantic model whose field defaults are *the* defaults: ``SearchOptions``,
  ``PerplexitySettings``): :func:`settings_command` gives a command one flag per field; the values given
  arrive as ``ctx.meta[SETTINGS]`` and :func:`build_settings` turns them into the model.

Each declared name becomes one flag (``beta_fast`` → ``--beta-fast``; a ``bool`` → ``--x/--no-x``; a list →
comma-separated values or a JSON list); the help is the declaration's description. A generated flag has no
default of its own: what is not given is left out, so the model's default applies (``--help`` shows it).
The flags are built when the command is, so a method registered before the command line runs (a plugin
module) gets its flags too.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperCommand

from ctxext.errors import InputError
from ctxext.rope.methods import declared_options

# Where a command finds the method options it was given.
ROPE_OPTIONS = "ctxext.rope_options"
# Where a command finds the settings fields it was given.
SETTINGS = "ctxext.settings"
_METHOD_PANEL = "Method options (each for the methods named)"


def flag_name(name: str) -> str:
    """The flag of a declared name: ``beta_fast`` → ``--beta-fast``."""
    return "--" + name.replace("_", "-")


def _item(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a word such as 2x or target: the model's type decides


def parse_list(text: str) -> list[Any]:
    """A list flag's value: items separated by commas (``1,1.2,1.5``, ``1x,2x``) or a JSON list.

    Numbers become numbers, other items stay strings; the declaration's type converts and checks them.

    Raises:
        typer.BadParameter: a JSON list that does not parse.
    """
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            raise typer.BadParameter(f"give values separated by commas (1,1.2,1.5) or a JSON list: {text!r}") from None
        return list(value) if isinstance(value, list) else [value]
    return [_item(part.strip()) for part in stripped.split(",") if part.strip()]


@dataclass(frozen=True)
class FlagSpec:
    """One generated flag: the keyword it fills, its type, help text and help panel."""

    name: str
    type: Any
    help: str
    panel: str | None = None

    @property
    def is_list(self) -> bool:
        """Whether the flag takes a list (given as comma-separated values)."""
        return typing.get_origin(_unwrap_optional(self.type)) is list

    @property
    def numbers_only(self) -> bool:
        """Whether the flag takes a list of numbers (``list[float]``, ``list[int]``): a word in it is an error."""
        args = typing.get_args(_unwrap_optional(self.type))
        return self.is_list and bool(args) and args[0] in (int, float)

    @property
    def cli_type(self) -> Any:
        """What typer parses the flag as: the declared scalar type, else ``str`` (converted by the declaration)."""
        kind = _unwrap_optional(self.type)
        return kind if kind in (bool, int, float, str) else str


def _unwrap_optional(kind: Any) -> Any:
    """``X`` of ``X | None``; any other type unchanged."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def typer_params(specs: Iterable[FlagSpec]) -> list[Any]:
    """The click parameters of the flags, built by typer from a generated signature (each defaults to None)."""
    params, annotations = [], {}
    for spec in specs:
        flag = flag_name(spec.name)
        decl = f"{flag}/--no-{flag[2:]}" if spec.cli_type is bool and not spec.is_list else flag
        metavar = "A,B,…" if spec.is_list else None
        annotations[spec.name] = Annotated[
            spec.cli_type | None, typer.Option(decl, help=spec.help, rich_help_panel=spec.panel, metavar=metavar)
        ]
        keyword = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(spec.name, keyword, default=None, annotation=annotations[spec.name]))

    def flags(**_: Any) -> None:  # only its signature is read
        return None

    flags.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    flags.__annotations__ = annotations
    app = typer.Typer(add_completion=False)
    app.command()(flags)
    return [p for p in typer.main.get_command(app).params if p.name in annotations]


class GeneratedFlagsCommand(TyperCommand):
    """A typer command with generated flags; the values given go to ``ctx.meta[self.meta_key]`` as a dict.

    Subclasses set :attr:`meta_key` and :meth:`specs`. A flag that is not given is left out of the dict.
    The flags are generated when the command is parsed or its help shown, not when the command line is
    built: ``ctxext --help`` does not import (or build) any settings model.
    """

    meta_key = ""
    _specs: dict[str, FlagSpec] | None = None

    def specs(self) -> list[FlagSpec]:
        """The flags to generate."""
        raise NotImplementedError

    def generated(self) -> dict[str, FlagSpec]:
        """The generated flags by name (built, and added to the command's parameters, on first use)."""
        if self._specs is None:
            self._specs = {spec.name: spec for spec in self.specs()}
            self.params.extend(typer_params(self._specs.values()))
        return self._specs

    def get_params(self, ctx: Any) -> list[Any]:
        """The command's parameters, the generated flags included (click parses and shows help from these)."""
        self.generated()
        return list(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:  # typer's click Context
        """Move the generated flags' values out of the typed parameters, then run the command."""
        specs = self.generated()
        given = {name: ctx.params.pop(name) for name in list(ctx.params) if name in specs}
        given = {name: value for name, value in given.items() if value is not None}
        for name, value in given.items():
            spec = specs[name]
            if spec.is_list:
                try:
                    given[name] = parse_list(value)
                    if spec.numbers_only and any(isinstance(v, str) for v in given[name]):
                        raise typer.BadParameter(f"give numbers separated by commas (1,1.2,1.5), got {value!r}")
                except typer.BadParameter as exc:
                    exc.param_hint = flag_name(name)
                    raise
        ctx.meta[self.meta_key] = given
        return super().invoke(ctx)


class MethodOptionsCommand(GeneratedFlagsCommand):
    """A typer command with the generated method-option flags; their values go to ``ctx.meta[ROPE_OPTIONS]``."""

    meta_key = ROPE_OPTIONS

    def specs(self) -> list[FlagSpec]:
        """One flag per declared option of every registered method."""
        options = declared_options().items()
        return [FlagSpec(name, shared.option.type, shared.help, _METHOD_PANEL) for name, shared in options]


def field_help(info: Any) -> str:
    """A settings field's help: its description and its default (the model's, the only one)."""
    if info.is_required():
        return f"{info.description or ''} (required)".strip()
    default = info.get_default(call_default_factory=True)
    if isinstance(default, str) and "\n" in default:
        shown = repr(default)  # one line in the help: the template's newlines as \n
    elif isinstance(default, list):
        shown = ",".join(map(str, default)) or "none"
    else:
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else default
    # Round brackets: rich would read "[default: …]" as markup and drop it.
    return f"{info.description or ''} (default: {shown})".strip()


def settings_specs(model: Any, exclude: Iterable[str] = (), panel: str | None = None) -> list[FlagSpec]:
    """One :class:`FlagSpec` per field of a pydantic settings model (but ``exclude``)."""
    skip = set(exclude)
    return [
        FlagSpec(name, info.annotation, field_help(info), panel)
        for name, info in model.model_fields.items()
        if name not in skip
    ]


def load_model_class(path: str) -> Any:
    """The class named by ``"package.module:Name"`` (imported on use)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def settings_command(
    model: str | type[Any], exclude: Iterable[str] = (), panel: str | None = None
) -> type[TyperCommand]:
    """A command class whose flags are generated from a settings model's fields (``@app.command(cls=…)``).

    Args:
        model: the pydantic settings model, as ``"package.module:Name"``: it is imported only when the
            command is parsed or its help shown (pydantic and the model cost time at every start); or the
            model class itself, where it is imported already (a registered suite section's).
        exclude: fields the command does not take as flags.
        panel: the ``--help`` panel of the generated flags.

    Returns:
        A :class:`GeneratedFlagsCommand` subclass; the command reads the given values from ``ctx.meta[SETTINGS]``.
    """
    skip = tuple(exclude)

    class SettingsCommand(GeneratedFlagsCommand):
        meta_key = SETTINGS
        model_path = model

        def specs(self) -> list[FlagSpec]:
            return settings_specs(load_model_class(model) if isinstance(model, str) else model, skip, panel)

    name = model.rpartition(":")[2] if isinstance(model, str) else model.__name__
    SettingsCommand.__name__ = f"{name}Command"
    return SettingsCommand


def build_settings(model: Any, given: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> Any:
    """The settings model from the flags given, over ``base`` (e.g. a recipe section); defaults fill the rest.

    Args:
        model: the pydantic settings model.
        given: the generated flags' values that were given (``ctx.meta[SETTINGS]``).
        base: values the flags override (a recipe section, the command's own arguments).

    Raises:
        InputError: every invalid value at once, each named by its flag.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate({**(base or {}), **given})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = error["loc"]
            message = error["msg"].removeprefix("Value error, ")
            # A check across fields (no location) names its keys in its own message.
            problems.append(f"{flag_name(str(loc[0]))}: {message}" if loc else message)
        raise InputError("; ".join(problems)) from None
