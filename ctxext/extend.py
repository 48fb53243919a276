"""Training-free extension of a model folder: ``ctxext extend``.

The output is a plain model folder (patched ``config.json``, tokenizer and generation config copied,
weights hard-linked or copied) that vanilla ``AutoModelForCausalLM.from_pretrained`` loads with the
right RoPE. It is written to a temporary sibling folder and renamed into place only once its
runtime RoPE has been verified, so a failure leaves nothing at the output path.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ctxext.atomic import atomic_folder
from ctxext.rope import (
    RopePlan,
    apply_plan,
    check_model_rope,
    legacy_fields,
    plan_extension,
    runtime_model_from_config,
)
from ctxext.sources import load_config

# Files that belong to the model besides config.json.
_COPY_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".tiktoken", ".py", ".jinja")


def _link_or_copy(src: Path, dst: Path) -> str:
    try:
        os.link(src, dst)
        return "linked"
    except OSError:
        shutil.copy2(src, dst)
        return "copied"


def extend_folder(
    model: str,
    out: str | Path,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
    write_legacy: bool = False,
    overwrite: bool = False,
) -> RopePlan:
    """Write an extended copy of a model folder.

    Args:
        model: local folder, Hub id or ``builtin:NAME``.
        out: output folder (must not exist unless ``overwrite``).
        method: a registered method name.
        target_length: the new context length.
        options: method options.
        original_length: overrides the pretraining length.
        write_legacy: also write ``rope_scaling`` / ``rope_theta`` for pre-5 transformers consumers.
        overwrite: replace an existing output folder.

    Returns:
        The applied :class:`RopePlan`.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        RopeError: a bad method, option or target.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; choose another --out or pass --overwrite")
    config, folder = load_config(model)
    if not folder.is_dir():
        from ctxext.sources import resolve_model_path

        folder = resolve_model_path(model)
    plan = plan_extension(config, method, target_length, options, original_length)
    apply_plan(config, plan)
    # Check the runtime RoPE the saved config produces before anything is written.
    result = check_model_rope(runtime_model_from_config(config))
    if not result.ok:
        from ctxext.rope import RopeMismatchError

        raise RopeMismatchError(result.summary())

    with atomic_folder(out) as tmp:
        for src in sorted(folder.iterdir()):
            if src.is_file() and src.name != "config.json" and src.suffix in _COPY_SUFFIXES:
                _link_or_copy(src.resolve(), tmp / src.name)
        config.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        data = json.loads(cfg_path.read_text())
        if write_legacy:
            data.update(legacy_fields(plan.rope_parameters))
        cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return plan
