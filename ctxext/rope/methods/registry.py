"""The registry of RoPE extension methods: every module of ``ctxext/rope/methods/`` registers one class.

Built-in methods are found by listing the package, so adding a method is adding its module; methods
defined elsewhere register with the same decorator once imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from ctxext.rope.methods.base import Option, RopeMethod
from ctxext.rope.types import RopeError

METHODS: dict[str, RopeMethod] = {}

# Modules of this package that hold machinery, not a method.
_NOT_METHODS = frozenset({"base", "registry"})


def register_method(cls: type[RopeMethod]) -> type[RopeMethod]:
    """Class decorator: register a :class:`~ctxext.rope.methods.base.RopeMethod` subclass under its ``name``.

    Raises:
        ValueError: a method without a name or summary, a name registered twice, an option declared twice,
            or an option that another method declares with a different type (one recipe key, one flag).
    """
    if not cls.name or not cls.summary:
        raise ValueError(f"{cls.__name__} needs a name and a summary")
    if cls.name in METHODS and type(METHODS[cls.name]) is not cls:
        previous = type(METHODS[cls.name]).__name__
        raise ValueError(f"method {cls.name!r} is registered twice ({previous}, {cls.__name__})")
    names = [o.name for o in cls.options]
    if len(set(names)) != len(names):
        raise ValueError(f"{cls.__name__} declares an option twice: {names}")
    # Keys of the rope section and parameters of `ctxext extend` that are not method options.
    reserved = {"method", "target_length", "relative_to", "original_length", "model", "out", "overwrite"}
    reserved |= {"legacy_fields"}
    for option in cls.options:
        if option.name in reserved or not option.name.isidentifier():
            raise ValueError(f"{cls.__name__}: {option.name!r} is reserved or not an identifier")
        shared = declared_options().get(option.name)
        if shared and shared.option.type != option.type and cls.name not in shared.methods:
            raise ValueError(
                f"{cls.__name__}: option {option.name!r} is {option.type_name} here but {shared.option.type_name} in "
                f"{', '.join(shared.methods)}; one recipe key and one flag need one type"
            )
    METHODS[cls.name] = cls()
    ordered = sorted(METHODS.values(), key=lambda m: m.order)  # stable: equal orders keep registration order
    METHODS.clear()
    METHODS.update((m.name, m) for m in ordered)
    return cls


def unregister_method(name: str) -> None:
    """Remove a registered method (a plugin's, or a test's)."""
    METHODS.pop(name, None)


def get_method(name: str) -> RopeMethod:
    """The method registered as ``name``.

    Raises:
        RopeError: an unknown name (the message lists the known ones).
    """
    if name not in METHODS:
        raise RopeError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")
    return METHODS[name]


@dataclass(frozen=True)
class SharedOption:
    """An option key as the recipe schema and the command line see it: one declaration, the methods taking it.

    Attributes:
        option: the declaration (of the first method that declares it).
        methods: the methods that take the option, in listing order.
        helps: each method's help text for it (with its default, when it has one).
    """

    option: Option
    methods: tuple[str, ...]
    helps: tuple[str, ...]

    @property
    def help(self) -> str:
        """``yarn: …`` or ``yarn, longrope: …``: which methods take the option and what it does."""
        if len(set(self.helps)) == 1:
            return f"{', '.join(self.methods)}: {self.helps[0]}"
        return "; ".join(f"{m}: {h}" for m, h in zip(self.methods, self.helps, strict=True))


def declared_options() -> dict[str, SharedOption]:
    """Every option key of every registered method (the ``rope.*`` recipe keys and the ``extend`` flags)."""
    out: dict[str, SharedOption] = {}
    for method in METHODS.values():
        for option in method.options:
            seen = out.get(option.name)
            text = option.help if option.default is None else f"{option.help} (default {option.default!r})"
            if seen is None:
                out[option.name] = SharedOption(option, (method.name,), (text,))
            else:
                out[option.name] = SharedOption(seen.option, seen.methods + (method.name,), seen.helps + (text,))
    return out


def load_builtin_methods() -> None:
    """Import every method module of this package (each registers its class)."""
    package = importlib.import_module("ctxext.rope.methods")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_METHODS and not info.name.startswith("_"):
            importlib.import_module(f"ctxext.rope.methods.{info.name}")
