"""The run folder as ``ctxext train`` writes it; :mod:`ctxext.artifacts.run` is its reader.

Order of writing: the output folder is checked (new, or a run to resume with the same recipe) before
anything is loaded; ``recipe.yaml``, ``versions.json``, ``mixture.json`` and a ``running`` ``run.json``
once the model and the data are known to be usable; ``metrics.jsonl`` during the run; the adapter,
patched config and tokenizer at the end; ``run.json`` with ``"status": "complete"`` last.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ctxext.artifacts.lock import LOCK_SUFFIX, folder_lock
from ctxext.artifacts.run import METRICS_FILE, RUN_FILE, read_run, resume_command
from ctxext.artifacts.run_record import LoraRecord, RunRecord
from ctxext.atomic import check_output, write_json_atomic
from ctxext.errors import InputError, is_disk_full
from ctxext.recipe.schema import Recipe, RecipeError, dump_recipe, parse_recipe, run_keeping_keys

CHECKPOINTS = "checkpoints"
RECIPE_FILE = "recipe.yaml"


def check_output_dir(out: Path, recipe_text: str, resume: bool, search_folder: Path | None = None) -> RunRecord | None:
    """Check that ``out`` can take a new run, or holds the incomplete run of this recipe to resume.

    Args:
        out: the run folder (``output.dir``).
        recipe_text: the resolved recipe as YAML.
        resume: ``--resume``.
        search_folder: the recipe's factor search; a new run may start in a folder that holds only it.

    Returns:
        The previous run's record when resuming, else ``None``.

    Raises:
        InputError: a folder in the way, nothing to resume, a complete run, or another recipe.
    """
    run_file = out / RUN_FILE
    if resume:
        if not run_file.is_file():
            raise InputError(f"--resume: {out} holds no run to resume (no {RUN_FILE}); drop --resume to start one")
        previous = read_run(out, allow_incomplete=True)
        if previous.complete:
            raise InputError(f"--resume: the run in {out} is already complete")
        saved = (out / RECIPE_FILE).read_text() if (out / RECIPE_FILE).is_file() else None
        if saved is not None and saved != recipe_text:
            diffs = recipe_diffs(saved, recipe_text)
            if diffs:
                raise InputError(
                    "--resume: the recipe differs from the run's recipe.yaml (" + "; ".join(diffs) + "); "
                    f"resume with the same recipe and overrides: `{resume_command(out)}`"
                )
        return previous
    ours = _search_entries(out, search_folder)
    if out.exists() and out.is_dir() and any(p.name not in ours for p in out.iterdir()):
        status = run_status(out)
        hint = "pass --resume to continue it, or " if status not in (None, "complete") else ""
        what = "holds a complete run" if status == "complete" else "already exists and is not empty"
        raise InputError(f"output.dir: {out} {what}; {hint}choose another output.dir")
    if out.is_dir() and ours and any(out.iterdir()):
        if not os.access(out, os.W_OK | os.X_OK):
            raise InputError(f"output.dir {out}: is not writable; choose an output folder in a writable place")
        return None  # it holds only the search made for this run
    check_output(out, "run", overwrite=False, flag="output.dir")
    return None


def run_status(out: Path) -> str | None:
    """The ``status`` of the run in ``out`` (``complete``, ``interrupted`` …); ``None`` without a readable run."""
    try:
        return RunRecord.read(out).status if (out / RUN_FILE).is_file() else None
    except InputError:
        return None


def _search_entries(out: Path, search_folder: Path | None) -> frozenset[str]:
    """The names a run's own search leaves in the run folder: its folder and (when stale) its lock file."""
    if search_folder is None or Path(os.path.abspath(search_folder)).parent != Path(os.path.abspath(out)):
        return frozenset()
    return frozenset({search_folder.name, f".{search_folder.name}{LOCK_SUFFIX}"})


@contextmanager
def run_folder_lock(out: Path, launch: Any) -> Iterator[None]:
    """Hold the lock of the run folder for the whole run (the main process takes it; all processes agree).

    Args:
        out: the run folder (``output.dir``).
        launch: the job (:class:`ctxext.training.launch.Launch`).

    Raises:
        InputError: another process is writing ``out`` (a second ``train``, or a ``--resume`` of a run in
            progress), raised on every process of the job.
    """
    with ExitStack() as stack:
        refused: list[str | None] = [None]
        if launch.main:
            try:
                stack.enter_context(folder_lock(out, flag="output.dir"))
            except InputError as exc:
                refused = [str(exc)]
        if launch.accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(refused)  # the other processes must not start loading alone
        if refused[0]:
            raise InputError(refused[0])
        yield


def recipe_diffs(saved: str, new: str) -> list[str]:
    """``key: old → new`` for every recipe setting that changed what the run learns (sorted).

    The saved recipe is read through the current schema first, so a key added since the run was written (a new
    section, a new setting) counts as its default, not as a change: a run resumes after an upgrade. The run
    folder's place and the settings that only keep the run (:func:`~ctxext.recipe.schema.run_keeping_keys`:
    checkpoints, logs) are not changes: a long run started without ``train.save_every`` can resume with it.
    """
    import yaml

    old_keys, new_keys = flat_keys(_with_defaults(yaml.safe_load(saved))), flat_keys(yaml.safe_load(new))
    # A run folder may be moved: its new place is not a change of recipe.
    exempt = run_keeping_keys() | {"output.dir"}
    return sorted(
        f"{k}: {old_keys.get(k)!r} → {new_keys.get(k)!r}"
        for k in set(old_keys) | set(new_keys)
        if old_keys.get(k) != new_keys.get(k) and k not in exempt
    )


def _with_defaults(data: Any) -> Any:
    """A saved recipe with the current schema's defaults for the keys it predates.

    One that no longer parses is kept as written: then every difference shows.
    """
    import yaml

    try:
        return yaml.safe_load(dump_recipe(parse_recipe(data)))
    except RecipeError:
        return data


def flat_keys(data: Any) -> dict[str, Any]:
    """``section.key`` → value of a recipe dict (sections may be null or scalars)."""
    flat: dict[str, Any] = {}
    for section, fields in (data or {}).items():
        if isinstance(fields, dict):
            flat.update({f"{section}.{key}": value for key, value in fields.items()})
        else:
            flat[section] = fields
    return flat


def flat_config(recipe: Recipe) -> dict[str, Any]:
    """The recipe as flat ``section.key`` scalars: trackers (tensorboard hparams) take nothing nested."""
    flat = flat_keys(json.loads(recipe.model_dump_json()))
    return {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flat.items()}


def versions(recipe: Recipe, command: list[str]) -> dict[str, Any]:
    """What ``versions.json`` records: Python, platform, library versions, seed and command line."""
    import importlib.metadata as md

    libs: dict[str, str | None] = {}
    for name in ("ctxext", "torch", "transformers", "peft", "bitsandbytes", "accelerate", "datasets", "tokenizers"):
        try:
            libs[name] = md.version(name)
        except md.PackageNotFoundError:
            libs[name] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": libs,
        "seed": recipe.train.seed,
        "command": command,
    }


def adapter_targets(model: Any, given: list[str]) -> list[str]:
    """The adapter's target modules by the model's own names (``all-linear`` resolved), as peft holds them.

    Args:
        model: the peft model (anything else: ``given`` is returned).
        given: the recipe's ``lora.target_modules``.
    """
    config = (getattr(model, "peft_config", None) or {}).get("default")
    names = getattr(config, "target_modules", None)
    return sorted(names) if names and not isinstance(names, str) else list(given)


def run_record(
    recipe: Recipe, loaded: Any, num_processes: int, base_fingerprint: str, previous: RunRecord | None
) -> RunRecord:
    """The record of a run that starts (status ``running``, no steps yet).

    Args:
        recipe: the recipe.
        loaded: the training model (:class:`ctxext.training.model.TrainingModel`).
        num_processes: processes in the job.
        base_fingerprint: the base weights' fingerprint (:func:`ctxext.models.weights.fingerprint`).
        previous: the resumed run's record (its initial validation loss and search are kept), or ``None``.
    """
    from ctxext.models.gguf import gguf_source

    plan = loaded.plan
    return RunRecord(
        status="running",
        base_model=recipe.model.path,
        base_model_resolved=str(loaded.base_path),
        base_model_revision=recipe.model.revision,
        base_fingerprint=base_fingerprint,
        base_gguf=gguf_source(loaded.base_path),  # the GGUF file a converted base came from (name, sha256)
        rope_parameters=plan.rope_parameters if plan else dict(loaded.model.config.rope_parameters or {}),
        original_length=plan.original_length if plan else None,
        target_length=plan.target_length if plan else None,
        method=recipe.rope.method,
        mode=recipe.train.mode,
        lora=None
        if recipe.train.mode == "full"
        else LoraRecord(
            r=recipe.lora.r,
            alpha=recipe.lora.alpha,
            dropout=recipe.lora.dropout,
            target_modules=adapter_targets(loaded.model, recipe.lora.target_modules),
        ),
        extra_trainable=loaded.extra_trainable,
        trainable_params=loaded.trainable_params,
        attn_implementation=loaded.attn_implementation,
        memory=loaded.levers,
        compute_dtype=str(loaded.compute_dtype).replace("torch.", ""),
        seq_len=recipe.seq_len,
        quantization=recipe.quantization.mode,
        num_processes=num_processes,
        initial_val_loss=previous.initial_val_loss if previous else None,
        search=previous.search if previous else None,
    )


class RunWriter:
    """Writes a run folder's files; only the main process touches the disk.

    Args:
        out: the run folder.
        main: whether this is the main process.
        run: the run's record (:func:`run_record`), changed by :meth:`update`.
    """

    def __init__(self, out: Path, main: bool, run: RunRecord):
        self.out = out
        self.main = main
        self.run = run

    def start(self, recipe_text: str, versions_info: dict[str, Any], mixture: dict[str, Any] | None) -> None:
        """Create the folder with ``recipe.yaml``, ``versions.json``, ``mixture.json`` and a ``running`` run.json."""
        if self.main:
            (self.out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
            (self.out / RECIPE_FILE).write_text(recipe_text)
            write_json_atomic(self.out / "versions.json", versions_info)
            if mixture is not None:
                write_json_atomic(self.out / "mixture.json", mixture)
        if mixture is not None:
            self.run.mixture = mixture["realised"]
        self.update()

    def update(self, **changes: Any) -> None:
        """Change fields of the record (each validated) and write ``run.json`` whole, atomically."""
        for name, value in changes.items():
            setattr(self.run, name, value)
        if self.main:
            self.run.write(self.out / RUN_FILE)

    def trim_metrics(self, step: int) -> None:
        """Drop metrics logged after ``step`` (the checkpoint resumed from), so ``metrics.jsonl`` reads as one run."""
        path = self.out / METRICS_FILE
        if self.main and path.exists():
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in lines if json.loads(ln)["step"] <= step]
            path.write_text("".join(ln + "\n" for ln in kept))

    def write_outputs(self, peft_model: Any, state_dict: dict, loaded: Any) -> None:
        """Adapter (a full fine-tune: the whole model), patched config, tokenizer: staged in a hidden folder, moved in.

        Raises:
            InputError: the disk filled up; the stage is removed and ``run.json`` says ``interrupted``.
        """
        stage = self.out / ".final-tmp"
        try:
            self._write_outputs(stage, peft_model, state_dict, loaded)
        except Exception as exc:
            full = is_disk_full(exc, self.out)
            shutil.rmtree(stage, ignore_errors=True)
            if not full:
                raise
            try:
                self.update(status="interrupted", error="disk full")
            except OSError:
                pass  # the message below still says how to resume
            raise InputError(
                f"output.dir {self.out}: the disk filled up while writing the final adapter; the run is kept as "
                f"interrupted. Free some space, then continue with `{resume_command(self.out)}` (it resumes from "
                "the last checkpoint)."
            ) from None

    def _write_outputs(self, stage: Path, peft_model: Any, state_dict: dict, loaded: Any) -> None:
        import torch
        from transformers import AutoConfig

        from ctxext.rope.plan import apply_plan
        from ctxext.rope.runtime import runtime_model_from_config, verify_against_plan

        out, plan = self.out, loaded.plan
        if stage.exists():
            shutil.rmtree(stage)
        prefix = "peft_model."
        peft_state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        # The base config as it was on disk, plus the RoPE plan: no quantization settings, no use_cache=False.
        config = AutoConfig.from_pretrained(loaded.base_path)
        if self.run.mode == "full":
            # Every weight: a complete model, stored in the base's dtype (the fp32 master copies rounded once).
            stored = getattr(config, "dtype", None)
            dtype = getattr(torch, str(stored).removeprefix("torch."), None) if stored else None
            if isinstance(dtype, torch.dtype):
                peft_state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in peft_state.items()}
        peft_model.save_pretrained(stage, state_dict=peft_state)
        if plan is not None:
            apply_plan(config, plan)
        config.save_pretrained(stage)
        if plan is not None:
            # The run's config.json is what merge and eval load: reloaded from disk, it must be the plan.
            verify_against_plan(runtime_model_from_config(AutoConfig.from_pretrained(stage)), plan)
        loaded.tokenizer.save_pretrained(stage)
        for item in stage.iterdir():
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)
        stage.rmdir()
