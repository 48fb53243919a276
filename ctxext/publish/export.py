"""``ctxext export SRC --for vllm|lm-eval|helmet``: a folder another stack loads with ctxext's RoPE, and its commands.

A run folder is merged first (:func:`ctxext.publish.merge.merge_run`: full precision, reloaded and verified);
a model folder (``ctxext extend`` / ``ctxext merge`` output) is used as it is. Each target is one registered
:class:`Target` that writes the exact command lines for the folder into ``COMMANDS.md`` (next to the merged
weights) and checks what that stack reads from ``config.json``:

* **lm-eval** (``lm_eval --model hf``) and **HELMET** (``model_utils/hf.py``) build the model with
  transformers from the folder: the scaling must be in ``config.json`` with ``rope_theta`` inside
  ``rope_parameters`` (transformers 5 falls back to 10000 without it). HELMET's ``--rope_theta`` /
  ``--rope_scaling`` flags override it (with ``--use_vllm``, ``--rope_scaling`` means dynamic NTK over an
  original length of 32768), so the commands never pass them.
* **vLLM** builds its rotary module in ``get_rope`` (``vllm/model_executor/layers/rotary_embedding``) from
  ``rope_parameters``: ``yarn``, ``llama3`` and ``longrope`` need ``original_max_position_embeddings`` there.
  Its longest accepted ``--max-model-len`` (``_get_and_verify_max_len`` in ``vllm/config/model.py``) is
  ``max_position_embeddings`` (capped by the tokenizer's ``model_max_length``) × ``factor``, except ``yarn``
  (``original_max_position_embeddings × factor``) and ``llama3`` / ``longrope`` (no factor); :func:`vllm_max_len`
  mirrors that reading, from vLLM's source (vLLM is not installed here).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.errors import InputError

COMMANDS_FILE = "COMMANDS.md"
# vLLM's get_rope reads these keys of rope_parameters by index (a KeyError if one is missing).
VLLM_REQUIRED_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
# A tokenizer's model_max_length above this is transformers' "unset" (int(1e30)).
_UNSET_MAX_LENGTH = 10**9


@dataclass
class ServingFacts:
    """What a model folder tells another stack about its positions.

    Attributes:
        folder: the model folder.
        rope_parameters: ``config.json``'s ``rope_parameters``.
        max_position_embeddings: ``config.json``'s value.
        context_length: the context ctxext reads from the config (the extension's target).
        original_length: the pretraining context.
        tokenizer_max_length: ``tokenizer_config.json``'s ``model_max_length`` when set.
    """

    folder: Path
    rope_parameters: dict[str, Any]
    max_position_embeddings: int
    context_length: int
    original_length: int
    tokenizer_max_length: int | None = None

    @property
    def rope_type(self) -> str:
        """The RoPE type (``default`` when unscaled)."""
        return str(self.rope_parameters.get("rope_type", "default"))


def serving_facts(folder: str | Path) -> ServingFacts:
    """Read a model folder's positions as other stacks will (its ``config.json`` and tokenizer config).

    Raises:
        InputError: a folder without ``config.json`` or one whose config has no ``rope_parameters``.
    """
    from ctxext.models.sources import config_from_folder
    from ctxext.rope.read import read_rope

    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise InputError(f"{folder} has no config.json: pass a run folder or a model folder (ctxext extend / merge)")
    raw = json.loads(path.read_text())
    params = raw.get("rope_parameters")
    if not isinstance(params, dict):
        raise InputError(
            f"{path} has no rope_parameters (a config written before transformers 5?): re-save it with ctxext extend"
        )
    state = read_rope(config_from_folder(folder))
    tok_max = None
    tok_path = folder / "tokenizer_config.json"
    if tok_path.is_file():
        value = json.loads(tok_path.read_text()).get("model_max_length")
        tok_max = int(value) if isinstance(value, (int, float)) and value < _UNSET_MAX_LENGTH else None
    return ServingFacts(
        folder=folder,
        rope_parameters=params,
        max_position_embeddings=int(raw.get("max_position_embeddings") or state.current_length),
        context_length=int(state.current_length),
        original_length=int(state.original_length),
        tokenizer_max_length=tok_max,
    )


def vllm_max_len(facts: ServingFacts) -> float:
    """The longest ``--max-model-len`` vLLM accepts for the folder without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``."""
    derived = float(facts.max_position_embeddings)
    if facts.tokenizer_max_length is not None:
        derived = min(derived, float(facts.tokenizer_max_length))
    params = facts.rope_parameters
    if facts.rope_type not in ("su", "longrope", "llama3"):
        if facts.rope_type == "yarn":
            derived = float(params["original_max_position_embeddings"])
        derived *= float(params.get("factor", 1.0))
    return derived


def serving_problems(facts: ServingFacts, target: str) -> list[str]:
    """What would make ``target`` load the folder with other positions than ctxext planned (empty: nothing)."""
    problems = []
    if "rope_theta" not in facts.rope_parameters:
        problems.append("rope_parameters has no rope_theta: transformers 5 and vLLM fall back to 10000")
    if target == "vllm":
        missing = [k for k in VLLM_REQUIRED_KEYS.get(facts.rope_type, ()) if k not in facts.rope_parameters]
        if missing:
            problems.append(f"vLLM's {facts.rope_type} RoPE reads rope_parameters[{missing[0]!r}], which is missing")
        elif vllm_max_len(facts) < facts.context_length:
            problems.append(
                f"vLLM derives a longest context of {vllm_max_len(facts):g} tokens (tokenizer model_max_length "
                f"{facts.tokenizer_max_length}), below {facts.context_length}: --max-model-len {facts.context_length} "
                "needs VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, or raise model_max_length in tokenizer_config.json"
            )
    return problems


@dataclass
class Target:
    """One stack ``ctxext export`` writes commands for.

    Attributes:
        name: the ``--for`` value.
        title: its heading in ``COMMANDS.md``.
        commands: the command lines for a folder.
        notes: what a user of that stack must know (differences from ctxext's own numbers).
    """

    name: str
    title: str
    commands: Callable[[ServingFacts], list[str]]
    notes: Callable[[ServingFacts], list[str]] = field(default=lambda facts: [])


TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    """Add a target to :data:`TARGETS` (by its name)."""
    TARGETS[target.name] = target
    return target


def _q(f: ServingFacts) -> str:
    return shlex.quote(str(f.folder))


def _vllm_commands(f: ServingFacts) -> list[str]:
    overrides = json.dumps(
        {"rope_parameters": f.rope_parameters, "max_position_embeddings": f.max_position_embeddings}, sort_keys=True
    )
    return [f"vllm serve {_q(f)} --max-model-len {f.context_length} --hf-overrides {shlex.quote(overrides)}"]


def _vllm_notes(f: ServingFacts) -> list[str]:
    notes = [
        "The folder's config.json already holds these values; --hf-overrides repeats them so a copy of the weights "
        "with an older config still serves with ctxext's RoPE. vLLM's rotary module was read from vLLM's source, "
        "not run here",
    ]
    if f.rope_type == "dynamic":
        notes.append(
            "vLLM's dynamic NTK is static: one base for max_position_embeddings × factor at every length, while "
            "transformers (and ctxext's numbers) rescale per sequence length; scores differ below the target"
        )
    if f.rope_type == "longrope":
        notes.append("vLLM defaults longrope models to the original length: keep --max-model-len")
    return notes


def _lm_eval_commands(f: ServingFacts) -> list[str]:
    return [
        f"lm_eval --model hf --model_args pretrained={_q(f)},max_length={f.context_length} --tasks TASKS "
        "--batch_size 1",
        f"ctxext eval harness --model {_q(f)} --tasks TASKS --out REPORT_DIR   # the same, on the verified model",
    ]


def _lm_eval_notes(f: ServingFacts) -> list[str]:
    return [
        "max_length counts prompt and generated tokens: lm-eval cuts a prompt longer than max_length minus the "
        "task's max_gen_toks from the left, without an error. For tasks exported by `ctxext tasks export`, use the "
        "max_length it prints (the longest length plus its answer budget)",
        "ctxext's own tasks run offline with `ctxext tasks export DIR --format lm-eval --model FOLDER "
        "--tasks needle --lengths L` and `--include_path DIR`",
    ]


def _helmet_commands(f: ServingFacts) -> list[str]:
    return [
        f"python eval.py --config configs/recall.yaml --model_name_or_path {_q(f)} "
        f"--input_max_length {f.context_length} --output_dir output/{shlex.quote(f.folder.name)}",
    ]


def _helmet_notes(f: ServingFacts) -> list[str]:
    return [
        "Pass neither --rope_theta nor --rope_scaling: the folder's config.json carries the scaling, and those "
        "flags replace it (with --use_vllm, --rope_scaling means dynamic NTK over an original length of 32768)",
        f"--input_max_length is HELMET's total budget (prompt + generation); keep it at or below {f.context_length}",
    ]


register_target(Target("vllm", "vLLM", _vllm_commands, _vllm_notes))
register_target(Target("lm-eval", "lm-evaluation-harness", _lm_eval_commands, _lm_eval_notes))
register_target(Target("helmet", "HELMET", _helmet_commands, _helmet_notes))


def commands_markdown(facts: ServingFacts, targets: list[str]) -> str:
    """``COMMANDS.md``: the folder's positions, then each target's command lines, notes and problems."""
    lines = [
        f"# Running {facts.folder.name} in other stacks",
        "",
        f"RoPE `{facts.rope_type}` ({json.dumps(facts.rope_parameters, sort_keys=True)}), "
        f"max_position_embeddings {facts.max_position_embeddings}: a context of {facts.context_length} tokens "
        f"(pretrained at {facts.original_length}). Written by `ctxext export`.",
        "",
    ]
    for name in targets:
        target = TARGETS[name]
        lines += [f"## {target.title}", "", "```bash", *target.commands(facts), "```", ""]
        lines += [f"- {n}." for n in target.notes(facts)]
        lines += [f"- **Problem:** {p}." for p in serving_problems(facts, name)]
        lines.append("")
    return "\n".join(lines)


def check_targets(targets: list[str]) -> None:
    """Raise :class:`InputError` for a target that is not registered."""
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise InputError(f"--for {', '.join(unknown) or '(none)'}: choose from {', '.join(TARGETS)}")


def export_for(
    src: str | Path,
    targets: list[str],
    out: str | Path | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> tuple[Path, str]:
    """Make ``src`` ready for ``targets``: merge a run into ``out``, write the commands.

    Args:
        src: a ``ctxext train`` run folder (merged into ``out``) or a model folder (used as it is).
        targets: registered target names (``vllm``, ``lm-eval``, ``helmet``).
        out: the merged folder for a run (required then; not allowed for a model folder).
        overwrite: replace an earlier merge at ``out``.
        log: where progress lines go.

    Returns:
        ``(folder, COMMANDS.md text)``; for a run, the text is also written into the merged folder.

    Raises:
        InputError: an unknown target, a run without ``--out``, a model folder with ``--out``, or a folder
            whose config cannot be read.
    """
    from ctxext.artifacts.run import is_run_folder

    check_targets(targets)
    src = Path(src)
    if not src.is_dir():
        what = "is a file, not a folder" if src.exists() else "does not exist"
        raise InputError(f"{src} {what}: pass a run folder or a model folder (ctxext extend / merge)")
    if not is_run_folder(src):
        if out is not None:
            raise InputError(f"--out: {src} is a model folder, used as it is; --out is where a run folder is merged")
        facts = serving_facts(src)
        return src, commands_markdown(facts, targets)
    if out is None:
        raise InputError(f"{src} is a training run: give --out, the folder its merged model is written to")
    from ctxext.atomic import write_manifest
    from ctxext.publish.merge import MERGED_KIND, merge_run

    merge_run(src, out, overwrite=overwrite, log=log, force_flag=None)  # export has no --force
    out = Path(out)
    text = commands_markdown(serving_facts(out), targets)
    (out / COMMANDS_FILE).write_text(text)
    write_manifest(out, MERGED_KIND)  # COMMANDS.md is ctxext's too: a later --overwrite may replace it
    return out, text
