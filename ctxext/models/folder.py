"""Training-free extension of a model folder: ``ctxext extend``.

The output is a plain model folder (patched ``config.json``, every other file of the model copied,
weights hard-linked when possible) that vanilla ``AutoModelForCausalLM.from_pretrained`` loads with
the right RoPE. It is written to a temporary sibling folder, reloaded from disk and verified against
the plan (cos/sin at 0, L − 1, T − 1; weights readable), and renamed into place only then, so a
failure leaves nothing at the output path.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ctxext.artifacts.lock import folder_lock
from ctxext.atomic import atomic_folder, check_inputs_outside, check_output
from ctxext.models.sources import load_config, resolve_model_path
from ctxext.models.weights import check_weights_readable
from ctxext.rope.plan import apply_plan, legacy_fields, plan_extension
from ctxext.rope.types import RopePlan
from ctxext.rope.verify import verify_folder

MODEL_KIND = "model"
# Files that belong to the model besides config.json.
_COPY_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".tiktoken", ".py", ".jinja")
# Weights are hard-linked: nothing edits a weight file in place (save_pretrained writes new files and
# transformers never opens them for writing), so a link is as safe as a copy and costs no disk.
# Everything else (tokenizer, generation config, chat template) is small and often edited by hand: it
# is copied, so editing the extended folder never edits the source model.
_LINKED_SUFFIXES = (".safetensors", ".bin")


def _place(src: Path, dst: Path) -> None:
    if src.suffix in _LINKED_SUFFIXES:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def extend_folder(
    model: str,
    out: str | Path,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
    write_legacy: bool = False,
    overwrite: bool = False,
    relative_to: str | None = None,
) -> RopePlan:
    """Write an extended copy of a model folder, verified on what was written.

    Args:
        model: local folder, Hub id or ``builtin:NAME``.
        out: output folder (must not exist unless ``overwrite``, and then only an earlier ``extend``
            output; never the source model).
        method: a registered method name.
        target_length: the new context length.
        options: method options.
        original_length: overrides the pretraining length.
        write_legacy: also write ``rope_scaling`` / ``rope_theta`` for pre-5 transformers consumers.
        overwrite: replace an existing output folder that ctxext wrote.
        relative_to: for an already-extended model, ``original`` or ``current`` (see
            :func:`ctxext.rope.plan.plan_extension`).

    Returns:
        The applied :class:`RopePlan`; its last note is the verification summary.

    Raises:
        InputError: ``out`` cannot be written without loss, or the source's weights are damaged.
        RopeError: a bad method, option or target, or a written folder that does not match the plan.
    """
    out = Path(out)
    check_output(out, MODEL_KIND, overwrite)
    with folder_lock(out):  # one writer per folder, from the first check to the last write
        config, folder = load_config(model)
        if not folder.is_dir():
            folder = resolve_model_path(model)
        check_inputs_outside(out, [folder])
        plan = plan_extension(config, method, target_length, options, original_length, relative_to)
        apply_plan(config, plan)
        check_weights_readable(folder)

        with atomic_folder(out, kind=MODEL_KIND, overwrite=overwrite) as tmp:
            for src in sorted(folder.iterdir()):
                if src.is_file() and src.name != "config.json" and src.suffix in _COPY_SUFFIXES:
                    _place(src.resolve(), tmp / src.name)
            config.save_pretrained(tmp)
            cfg_path = tmp / "config.json"
            data = json.loads(cfg_path.read_text())
            if write_legacy:
                data.update(legacy_fields(plan.rope_parameters))
            cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            plan.notes.append(verify_folder(tmp, plan))
        return plan
