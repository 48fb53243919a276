"""Orchestration: the ``ctxext`` command line, its ``eval`` subcommands, ``validate``, console, demo.

The only layer that chains workflows and talks to the terminal (:mod:`~ctxext.cli.commands` holds the
app). Heavy modules are imported inside commands, so ``ctxext --help`` stays fast.
"""
