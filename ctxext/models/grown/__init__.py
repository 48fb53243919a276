"""The grown models (``builtin:grown-code-64*``): small Llamas pretrained here on stdlib code.

No real checkpoint can be downloaded on these machines and a random model says nothing about context
extension, so ctxext grows its own: a byte-level BPE tokenizer trained on the standard library's training
split, a ~4.2M-parameter Llama pretrained at a 64-token window on windows of that code, some carrying
key/value needles or repeated spans so that the model uses its whole window. ``benchmarks/grow_base.py``
is the command line (and measures what was grown); :func:`grow` is the whole recipe, deterministic. The
same recipe grows other shapes (``GrowSettings.arch``: Qwen2 with grouped-query attention, GPT-NeoX with
partial rotary; :mod:`ctxext.models.grown.arch`), to show that what ctxext does transfers.
"""

from ctxext.models.grown.data import Needles, Split, TrainingSequences, encode, encode_files, snap, split_files
from ctxext.models.grown.grow import HELDOUT_LIST, REPORT_JSON, grow
from ctxext.models.grown.settings import GrowSettings
from ctxext.models.grown.train import build_model, load_saved, pretrain, save_model

__all__ = [
    "HELDOUT_LIST",
    "REPORT_JSON",
    "GrowSettings",
    "Needles",
    "Split",
    "TrainingSequences",
    "build_model",
    "encode",
    "encode_files",
    "grow",
    "load_saved",
    "pretrain",
    "save_model",
    "snap",
    "split_files",
]
