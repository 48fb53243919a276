"""Core: RoPE: read a model's rotary settings, plan an extension, patch and verify the runtime frequencies.

:mod:`~ctxext.rope.core` holds the plan and runtime; :mod:`~ctxext.rope.methods` the registered scaling methods.
"""
