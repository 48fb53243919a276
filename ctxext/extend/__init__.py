"""Workflow: training-free extension of a model folder (``ctxext extend``) and ``ctxext inspect``."""
