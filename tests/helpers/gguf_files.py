"""Writing small GGUF files with the gguf package's own writer, as llama.cpp's converter lays them out.

A tiny Llama written this way converts back through transformers' GGUF support to the same logits, so the
conversion is tested in seconds without the 93 MB real file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute): q and k rows reordered for its rotary layout;
    # transformers' LlamaTensorProcessor reverses it on load.
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_llama_gguf(path: Path, model, tokenizer) -> Path:
    """Write a transformers Llama (float32) and its byte-level BPE tokenizer as a GGUF file."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-gguf")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_vocab_size(cfg.vocab_size)
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    special = {t["id"] for t in data["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([tok for tok, _ in vocab])
    writer.add_token_types([3 if i in special else 1 for _, i in vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    tied = cfg.tie_word_embeddings
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # llama.cpp writes no output matrix for tied embeddings
        array = tensor.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            array = _permute(array, cfg.num_attention_heads, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, cfg.num_attention_heads, cfg.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), np.ascontiguousarray(array))
    _finish(writer)
    return path


def write_arch_gguf(path: Path, arch: str) -> Path:
    """A complete, valid GGUF file of architecture ``arch`` with one small tensor (for refusals)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    _finish(writer)
    return path


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
