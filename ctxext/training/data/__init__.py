"""The training data pipeline: documents (:mod:`~ctxext.training.data.corpus`), the mixture, rows and PoSE positions."""
