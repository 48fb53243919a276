"""What a RoPE extension method declares: a name, a summary, its options, and how it plans an extension.

A method is one class. Its options are declared once, as :class:`Option` objects; the recipe schema
(``rope.<option>`` keys, ``ctxext validate --schema``), the ``ctxext extend --<option>`` flags and the
checks of :func:`ctxext.rope.plan.plan_extension` are all generated from that declaration. Nothing here
imports torch: the command line builds its flags from these classes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from ctxext.rope.types import RopeConfigError, RopePlan, RopeState


@cache
def _adapter(kind: Any) -> Any:
    # pydantic is imported on first use: the command line builds its flags from these classes.
    from pydantic import TypeAdapter

    return TypeAdapter(kind)


def type_name(kind: Any) -> str:
    """How a declared type reads in help texts: ``float``, ``bool``, ``list[float]``."""
    return str(kind) if getattr(kind, "__args__", None) else str(getattr(kind, "__name__", kind))


@dataclass(frozen=True)
class Option:
    """One option of a method: its recipe key (``rope.<name>``), CLI flag (``--<name-with-dashes>``) and keyword.

    Attributes:
        name: the key, a Python identifier.
        type: ``float``, ``int``, ``bool``, ``str`` or ``list[float]``; values are converted to it (pydantic, lax).
        help: one line for ``--help`` and ``ctxext validate --schema``.
        default: the value the method uses when the option is not given; ``None`` when there is no fixed
            default (the method computes one, or leaves the key out of ``rope_parameters``).
        check: an optional test of a converted value that needs neither the model nor the target; returns
            what is wrong, or ``None``.
    """

    name: str
    type: Any
    help: str
    default: Any = None
    check: Callable[[Any], str | None] | None = None

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--beta-fast``."""
        return "--" + self.name.replace("_", "-")

    @property
    def type_name(self) -> str:
        """The type as written in help texts."""
        return type_name(self.type)

    def parse(self, value: Any) -> Any:
        """Convert and check a given value.

        Args:
            value: from a recipe, a flag or a Python call.

        Returns:
            The value as :attr:`type`.

        Raises:
            ValueError: the value does not convert, or fails :attr:`check`; the message says why.
        """
        from pydantic import ValidationError

        if self.type is str and isinstance(value, os.PathLike):
            value = os.fspath(value)
        try:
            converted = _adapter(self.type).validate_python(value)
        except ValidationError as exc:
            raise ValueError(f"{exc.errors()[0]['msg']} ({self.type_name}), got {value!r}") from None
        problem = self.check(converted) if self.check else None
        if problem:
            raise ValueError(f"{problem}, got {value!r}")
        return converted


def positive(value: Any) -> str | None:
    """An :attr:`Option.check`: a finite number > 0."""
    return None if math.isfinite(value) and value > 0 else "must be a finite number > 0"


class RopeMethod:
    """Base class of an extension method; subclass it in one module of ``ctxext/rope/methods/``.

    Class attributes:
        name: the method's name in recipes (``rope.method``) and on the command line (``--method``).
        summary: one line for ``ctxext methods`` and help texts.
        options: the :class:`Option` declarations.
        order: position in listings (built-in methods: 10, 20 …; others default to after them).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    order: ClassVar[int] = 1000

    @property
    def option_names(self) -> frozenset[str]:
        """The names of the declared options."""
        return frozenset(o.name for o in self.options)

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every declared option's value: the given one (converted and checked), else its default.

        Args:
            given: option values that are set (``None`` values mean "not given").

        Returns:
            ``{name: value}`` for every declared option.

        Raises:
            RopeConfigError: unknown options or bad values, all named at once.
        """
        given = {k: v for k, v in given.items() if v is not None}
        problems: dict[str, str] = {}
        unknown = sorted(set(given) - self.option_names)
        allowed = ", ".join(sorted(self.option_names)) or "none"
        for key in unknown:
            problems[key] = f"not an option of method {self.name!r} (its options: {allowed})"
        values: dict[str, Any] = {}
        for option in self.options:
            if option.name not in given:
                values[option.name] = option.default
                continue
            try:
                values[option.name] = option.parse(given[option.name])
            except ValueError as exc:
                problems[option.name] = str(exc)
        if problems:
            raise RopeConfigError(problems)
        return values

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """Make the plan: the ``rope_parameters`` and ``max_position_embeddings`` that extend ``state``.

        Args:
            state: the RoPE to extend (unscaled, or the current one when stacking).
            target: the target context length.
            s: the scale ``target / state.original_length``.
            opts: every declared option, from :meth:`resolve`.

        Returns:
            The :class:`~ctxext.rope.types.RopePlan` (use :meth:`make_plan`).
        """
        raise NotImplementedError

    def intent_problems(self, plan: RopePlan) -> list[str]:
        """What in a plan's parameters contradicts this method's definition (checked after :meth:`plan`).

        The checks every method shares (factor, lengths, the rope type's relations) live in
        :func:`ctxext.rope.plan.check_plan_intent`; a method adds its own here.
        """
        return []

    # -- helpers for subclasses ---------------------------------------------------------------

    @staticmethod
    def base_parameters(state: RopeState) -> dict[str, Any]:
        """``rope_theta`` (and ``partial_rotary_factor`` when set) of the RoPE being extended."""
        params: dict[str, Any] = {"rope_theta": state.rope_theta}
        prf = state.parameters.get("partial_rotary_factor")
        if prf is not None:
            params["partial_rotary_factor"] = prf
        return params

    def make_plan(self, state: RopeState, target: int, s: float, params: dict[str, Any], max_pos: int) -> RopePlan:
        """This method's :class:`~ctxext.rope.types.RopePlan`: ``rope_parameters`` and ``max_position_embeddings``."""
        return RopePlan(
            method=self.name,
            rope_parameters=params,
            max_position_embeddings=max_pos,
            original_length=state.original_length,
            target_length=target,
            factor=s,
            rotary_dim=state.rotary_dim,
            base_parameters=dict(state.parameters),
        )
