"""The run record (``run.json``) as one typed model, read and written one way (like transformers' ``TrainerState``).

``ctxext train`` writes the record when a run starts (status ``running``), rewrites it whole and atomically when
something changes (``failed``, ``interrupted``), and last when the run is ``complete``. Merge, the model card, push,
calibration, evaluation and the loaders read it through :meth:`RunRecord.read`, so a record that cannot be read is
refused in one place with one message naming the file (exit code 2).

Records written by earlier versions read as they are: every field added since the first version has a default,
and fields this version does not know (an older record's extras, a newer version's additions) are kept and written
back unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ctxext.atomic import write_json_atomic
from ctxext.errors import InputError
from ctxext.recipe.memory import Levers

RUN_FILE = "run.json"
MERGE_FILE = "ctxext_merge.json"

RunStatus = Literal["running", "complete", "failed", "interrupted"]


class LoraRecord(BaseModel):
    """The LoRA settings a run trained with (its recipe's ``lora`` section, less the trained modules)."""

    model_config = ConfigDict(extra="allow")

    r: int | None = None
    alpha: float | None = None
    dropout: float | None = None
    target_modules: list[str] = Field(default_factory=list)


class TopologyRecord(BaseModel):
    """Where the job ran and how it split each sequence (:meth:`ctxext.training.launch.Launch.topology`)."""

    model_config = ConfigDict(extra="allow")

    world_size: int
    nodes: int = 1
    processes_per_node: int | None = None
    data_parallel: int | None = None
    sequence_parallel: int = 1
    context_parallel: int = 1
    ulysses: str | None = None
    sharding: str | None = None


class ProbeRecord(BaseModel):
    """The adaptive stop of a run (``train.probe``; the curve is ``probe.json``): why it stopped, and its cost."""

    model_config = ConfigDict(extra="allow")

    length: int
    trials: int
    keys: int
    interval: int
    goal: float
    # How a reading met the goal (train.probe.rule; runs before it was recorded used `worst`).
    rule: Literal["worst", "pooled"] = "worst"
    margin: float = 0.05
    patience: int | None = None
    # The key forms asked in, and (train.probe.forms: window) what the base retrieved inside its window.
    forms: list[int] = Field(default_factory=list)
    depths: list[float] | None = None
    filler_tokens: int = 0
    window_forms: list[dict[str, Any]] | None = None
    stopped: Literal["goal", "plateau", "ceiling"]
    stop_step: int
    best_step: int | None = None
    best_rate: float | None = None
    probes: int = 0
    seconds: float = 0.0
    loop_seconds: float = 0.0
    fraction: float | None = None


class RunRecord(BaseModel):
    """A run folder's ``run.json``: what was trained, from which base, how far, and how it ended.

    The first four fields are required (every version of ``ctxext train`` wrote them); the rest default to
    "not recorded".

    Attributes:
        status: ``running`` until the run ends; ``complete`` is written last, after the adapter.
        base_model: the base as the recipe named it (folder, Hub id or ``builtin:NAME``).
        method: the RoPE method (``none`` for a fine-tune at the base's own RoPE).
        target_length: the extended context (``None`` for ``method: none``).
        base_model_resolved: the local folder the base was loaded from.
        base_model_revision: the Hub revision of the base (``model.revision``).
        base_fingerprint: the base weights' fingerprint (:func:`ctxext.models.weights.fingerprint`).
        base_gguf: the GGUF file a converted base came from (``file``, ``sha256``), or ``None``.
        rope_parameters: the ``rope_parameters`` the run trained with.
        original_length: the base's context before the extension.
        seq_len: the training sequence length.
        mode: how the weights were trained (``qlora``, ``lora``: an adapter; ``full``: every weight, and the run
            folder is a complete model); ``None`` in records written before the key (adapters).
        lora: the LoRA settings (``None`` for a full fine-tune).
        extra_trainable: module paths trained in full.
        trainable_params: trainable parameters.
        attn_implementation: the attention implementation used.
        compute_dtype: the activations' dtype (``float32``, ``bfloat16`` …).
        quantization: the base weights during training (``nf4``, ``int8``, ``none``).
        memory: the memory levers used (``train.memory``, resolved).
        num_processes: processes in the job.
        topology: where the job ran and how it split each sequence.
        steps: optimizer steps done.
        tokens_seen: training tokens seen.
        initial_val_loss: the held-out loss before training.
        final_train_loss: the last step's training loss.
        final_val_loss: the held-out loss at the end.
        mixture: the realised training mixture (``mixture.json``'s ``realised``).
        search: the factor search the recipe's factors come from.
        probe: the adaptive stop (``train.probe``): why the run stopped, the best probe (the adapter's step), and
            the probe's share of the loop's wall time.
        error: why the run failed or was interrupted.
        folder: the run folder the record was read from (not stored in the file).
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    status: RunStatus
    base_model: str
    method: str
    target_length: int | None
    base_model_resolved: str | None = None
    base_model_revision: str | None = None
    base_fingerprint: str | None = None
    base_gguf: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] = Field(default_factory=dict)
    original_length: int | None = None
    seq_len: int | None = None
    mode: Literal["qlora", "lora", "full"] | None = None
    lora: LoraRecord | None = None
    extra_trainable: list[str] = Field(default_factory=list)
    trainable_params: int | None = None
    attn_implementation: str | None = None
    compute_dtype: str | None = None
    quantization: str | None = None
    memory: Levers | None = None
    num_processes: int | None = None
    topology: TopologyRecord | None = None
    steps: int = 0
    tokens_seen: int = 0
    initial_val_loss: float | None = None
    final_train_loss: float | None = None
    final_val_loss: float | None = None
    mixture: dict[str, Any] | None = None
    search: dict[str, Any] | None = None
    probe: ProbeRecord | None = None
    error: str | None = None
    folder: Path | None = Field(default=None, exclude=True)

    @property
    def complete(self) -> bool:
        """Whether the run finished (its adapter is the final one)."""
        return self.status == "complete"

    @property
    def factor(self) -> float | None:
        """``target_length / original_length``, when both are recorded."""
        if not self.target_length or not self.original_length:
            return None
        return self.target_length / self.original_length

    @classmethod
    def read(cls, path: str | Path) -> RunRecord:
        """Read and check a ``run.json``.

        Args:
            path: the run folder, or its ``run.json``.

        Returns:
            The record, with :attr:`folder` set to the run folder (absolute).

        Raises:
            InputError: no such file, not JSON, or not a run record (each field at fault named).
        """
        path = Path(path)
        file = path / RUN_FILE if path.is_dir() else path
        try:
            data = json.loads(file.read_text())
        except FileNotFoundError:
            raise InputError(
                f"{file.parent} is not a ctxext run folder (no {RUN_FILE}); pass the folder `ctxext train` wrote "
                "(its output.dir)"
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{file} cannot be read as JSON ({exc}); the run folder is damaged") from None
        record = cls.parse(data, str(file))
        record.folder = file.parent.resolve()
        return record

    @classmethod
    def parse(cls, data: Any, source: str) -> RunRecord:
        """Validate a run record already read (``run.json``, or the ``run`` of a merged folder's record).

        Args:
            data: the decoded JSON.
            source: the file it came from, for the message.

        Raises:
            InputError: not a run record, naming each field at fault.
        """
        if not isinstance(data, dict):
            raise InputError(f"{source} must hold a JSON object (a ctxext run record); the run folder is damaged")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            missing = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "missing"]
            if missing:
                raise InputError(
                    f"{source} lacks {', '.join(missing)}; it was not written by `ctxext train` (or was cut short)"
                ) from None
            bad = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise InputError(f"{source} is not a valid run record ({bad}); the run folder is damaged") from None

    def to_json_dict(self) -> dict[str, Any]:
        """The record as written to ``run.json`` (unknown fields included, :attr:`folder` not)."""
        return self.model_dump(mode="json")

    def write(self, path: str | Path) -> None:
        """Write the record whole and atomically (a reader never sees half of it, even on a full disk).

        Args:
            path: the run folder, or the ``run.json`` to write.
        """
        path = Path(path)
        write_json_atomic(path / RUN_FILE if path.is_dir() else path, self.to_json_dict())


class MergedRecord(BaseModel):
    """A merged model folder's ``ctxext_merge.json``: the source run's record and the merge's smoke test.

    Attributes:
        run: the source run's record (:attr:`RunRecord.folder` is the source run).
        smoke: the smoke test's results (:class:`ctxext.publish.merge.SmokeResult` as a dict).
        source_run: the run folder merged (absolute).
    """

    model_config = ConfigDict(extra="allow")

    run: RunRecord
    smoke: dict[str, Any] = Field(default_factory=dict)
    source_run: str | None = None

    @classmethod
    def read(cls, folder: str | Path) -> MergedRecord:
        """Read a merged folder's ``ctxext_merge.json``.

        Raises:
            InputError: the file is missing or damaged (merge again).
        """
        file = Path(folder) / MERGE_FILE
        again = "merge the run again with `ctxext merge`"
        try:
            data = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{file} cannot be read ({exc}); {again}") from None
        if not isinstance(data, dict) or not isinstance(data.get("run"), dict):
            raise InputError(f"{file} has no 'run' section; {again}")
        run = RunRecord.parse(data["run"], f"{file} (its 'run' section)")
        try:
            record = cls.model_validate({**data, "run": run})
        except ValidationError as exc:
            raise InputError(f"{file} is not a merge record ({exc.errors()[0]['msg']}); {again}") from None
        source = record.source_run or data["run"].get("run_dir")
        record.run.folder = Path(source) if source else None
        return record

    def write(self, folder: str | Path) -> None:
        """Write ``ctxext_merge.json`` into ``folder`` (atomically)."""
        write_json_atomic(Path(folder) / MERGE_FILE, self.model_dump(mode="json"))
