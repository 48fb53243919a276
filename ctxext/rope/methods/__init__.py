"""RoPE extension methods: one module per method, each one class that declares its options once.

Every module of this package (other than ``base`` and ``registry``) defines a
:class:`~ctxext.rope.methods.base.RopeMethod` subclass decorated with :func:`register_method`; importing
the package imports them all. The recipe schema, the ``ctxext extend`` flags and ``ctxext methods`` are
generated from :data:`METHODS`. See ``docs/extending.md``.
"""

from ctxext.rope.methods.base import Option, RopeMethod, positive
from ctxext.rope.methods.registry import (
    METHODS,
    SharedOption,
    declared_options,
    get_method,
    load_builtin_methods,
    register_method,
    unregister_method,
)

load_builtin_methods()

__all__ = [
    "METHODS",
    "Option",
    "RopeMethod",
    "SharedOption",
    "declared_options",
    "get_method",
    "positive",
    "register_method",
    "unregister_method",
]
