"""Workflow: the memory and time planner (``ctxext plan``) and its per-component footprint."""
