"""Third-party output that says nothing to a ctxext user, silenced unless ``ctxext --verbose`` asks for it.

Each entry names what it hides and why; everything else (errors, warnings of real problems) still shows.
Environment variables are set with ``setdefault``, so a user's own setting wins, and before the libraries are
imported (commands import them lazily), which is when they read them.
"""

from __future__ import annotations

import logging
import os
import warnings

# Read by the libraries at import time.
_ENV = {
    # transformers' advisory logging (e.g. generation-config notes) at every load; its errors still show.
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    # datasets draws a tqdm bar per map/filter of the data preparation (six per training run); ctxext shows
    # one progress display per stage itself.
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    # huggingface_hub's own download bars and its "unauthenticated requests" notes.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
}

# Loggers whose warnings are about their own optional speed-ups, not about the user's model or data.
_LOGGERS = {
    # "Failed to load CPU gemm_4bit_forward from kernels-community": an optional CPU kernel download; the
    # built-in kernel is used instead, with the same results.
    "bitsandbytes": logging.ERROR,
}

# Logger name → the starts of messages to drop. A filter, not a level: DeepSpeed sets its logger's level when it is
# imported (after this runs), and a filter survives that.
_MESSAGES = {
    # DeepSpeed (installed for sequence parallelism) says this on every CPU run, when accelerate or transformers
    # look for it, even when nothing uses it.
    "DeepSpeed": ("Setting accelerator to CPU",),
    # kernels (bitsandbytes' optional CPU kernel, looked up on every nf4 load) says this whenever the Hub is offline,
    # as ctxext's tests and offline users run; the kernel then is not used (the gemm note above), results the same.
    "kernels._internals.hf_hub": ("Skipping publisher trust check",),
}

# (message regex, category): deprecations inside other libraries that the user cannot act on.
_WARNINGS = [
    # peft reads model.is_gradient_checkpointing, which transformers 5 deprecates in favour of
    # is_activation_checkpointing; nothing for a ctxext user to change.
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning),
    # Tied embeddings: ctxext trains them tied (ensure_weight_tying), and an older adapter that trained a separate
    # input copy is merged untied with ctxext's own line and a model-card note (ctxext.models.embeddings), so
    # peft's warnings on loading and merging such an adapter say nothing the user must act on.
    (r"Model has `tie_word_embeddings=True` and a tied layer is part of the adapter", UserWarning),
    (r"Input and output embeddings are no longer tied after merging", UserWarning),
]


class _DropMessages(logging.Filter):
    """Drops a logger's records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record unless it is one of the listed messages."""
        return not record.getMessage().startswith(self.starts)


def quiet_third_party(verbose: bool = False) -> None:
    """Silence the third-party output listed in this module, unless ``verbose``.

    Args:
        verbose: show everything (``ctxext --verbose``).
    """
    if verbose:
        return
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)
    for name, level in _LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    for name, starts in _MESSAGES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):  # once per process, however often called
            logger.addFilter(_DropMessages(starts))
    for message, category in _WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
