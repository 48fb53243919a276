"""Tied embeddings: a model whose output projection (``lm_head``) is its input embedding matrix, one tensor.

Many small checkpoints tie them (SmolLM2, Qwen2-0.5B, Gemma): ``tie_word_embeddings: true`` in the config and no
separate output matrix in the weights. Every step that touches the embeddings must keep the two one tensor, or
say that it did not: training trains the shared matrix through peft's ``ensure_weight_tying``
(:func:`ctxext.training.model.add_lora`), merge checks the tie survives save and reload, and an older adapter that
trained only the input copy is merged untied, deliberately, with a note in the model card
(:func:`untie_if_diverged`).
"""

from __future__ import annotations

from typing import Any


def embeddings_tied(model: Any) -> bool:
    """Whether ``lm_head`` and the input embeddings of a transformers model are one tensor.

    Args:
        model: a transformers causal LM (not a peft wrapper: use its base model).
    """
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if inp is None or out is None:
        return False
    return bool(out.weight is inp.weight or out.weight.data_ptr() == inp.weight.data_ptr())


def ties_declared(config: Any) -> bool:
    """Whether a config asks for tied embeddings (``tie_word_embeddings`` of its text config)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", False))


def untie_if_diverged(model: Any, declared: bool) -> bool:
    """Mark a merged model untied when its output projection is no longer its input embedding matrix.

    An adapter trained with the input embedding as a separate trainable copy (peft's ``modules_to_save``
    without ``ensure_weight_tying``: runs made before ctxext tied them) leaves ``lm_head`` at the original
    weights. Saving that with ``tie_word_embeddings: true`` would silently replace ``lm_head`` by the trained
    embeddings on reload, so the config says untied instead (one more vocabulary × hidden matrix on disk).

    Args:
        model: the merged transformers model.
        declared: the base's config asked for tied embeddings (read before merging: peft 0.21's merge may
            already have cleared the flag).

    Returns:
        Whether it was untied (the caller says so to the user and in the model card).
    """
    if not declared or model.get_output_embeddings() is None or embeddings_tied(model):
        return False
    model.config.tie_word_embeddings = False
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    text.tie_word_embeddings = False
    return True
