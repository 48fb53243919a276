"""Core: RoPE: read a model's rotary settings, plan an extension, patch and verify the runtime frequencies.

:mod:`~ctxext.rope.read` reads what a config says; :mod:`~ctxext.rope.scaling_types` holds one record per
transformers rope type (its keys, checks and independent reference); :mod:`~ctxext.rope.plan` plans an
extension; :mod:`~ctxext.rope.runtime` patches and verifies the rotary modules; :mod:`~ctxext.rope.methods` holds
the registered scaling methods and :mod:`~ctxext.rope.types` the torch-free types.
"""
