"""The registry of synthetic long-range tasks: one module per task, registered by name."""

from __future__ import annotations

import importlib

from ctxext.errors import InputError
from ctxext.tasks.base import Task

TASKS: dict[str, Task] = {}

# The modules of the built-in tasks, imported on first look-up (each registers itself).
BUILTIN_MODULES = (
    "passkey",
    "needle",
    "multikey",
    "multivalue",
    "multiquery",
    "variable_tracking",
    "common_words",
    "copy_span",
    "json_kv",
    "doc_qa",
    "icl",
    "rerank",
    "mrcr",
)


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: register a :class:`~ctxext.tasks.base.Task` subclass under its ``name``.

    Raises:
        ValueError: a name registered twice, or a task without a name or templates.
    """
    if not cls.name or not cls.templates:
        raise ValueError(f"{cls.__name__} needs a name and at least one template")
    if cls.name in TASKS and type(TASKS[cls.name]) is not cls:
        raise ValueError(f"task {cls.name!r} is registered twice ({type(TASKS[cls.name]).__name__}, {cls.__name__})")
    TASKS[cls.name] = cls()
    return cls


def _load_builtin() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"ctxext.tasks.{module}")


def task_names() -> list[str]:
    """The registered task names."""
    _load_builtin()
    return list(TASKS)


def get_task(name: str) -> Task:
    """The task registered as ``name``.

    Raises:
        InputError: an unknown name (the message lists the known ones).
    """
    _load_builtin()
    if name not in TASKS:
        raise InputError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return TASKS[name]
