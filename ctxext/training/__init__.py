"""The pieces ``ctxext train`` (:mod:`ctxext.training.run`) is put together from, one concept per module.

- :mod:`~ctxext.training.launch`: the accelerator, the launch checks, the data-parallel geometry.
- :mod:`~ctxext.training.folder`: the run folder as training writes it (``run.json``, ``recipe.yaml``,
  ``versions.json``, ``metrics.jsonl``, the final adapter); :mod:`ctxext.artifacts.run` reads it back.
- :mod:`~ctxext.training.checkpoints`: accelerate checkpoints, saving and resuming.
- :mod:`~ctxext.training.steps`: the model wrapper with the chunked loss, the data order, the optimizer
  and one optimizer step.
- :mod:`~ctxext.training.loop`: the loop over steps, with logging and validation.
"""
