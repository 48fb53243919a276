"""Evaluation suites: one YAML file names the tasks, lengths, buckets, depths, trials and data.

Lengths (and context limits) are token counts or expressions relative to the *reference* model (the
model with the longest configured context among those evaluated, i.e. the extended one):

* ``"2x"``: twice the reference's original (pretraining) context;
* ``"target"``: the reference's configured context;
* ``"2x target"``: twice the reference's configured context — *beyond the target* (train short, test
  long: where PI, NTK and YaRN separate in the papers). Such lengths are always kept, every model is
  evaluated there, and the report marks them "beyond target".

Other relative lengths above the reference's context are dropped (and noted) unless
``allow_beyond_context`` is set; models with a shorter context (the base, in a comparison) are evaluated
at the same lengths, marked as beyond their context.

Example (``eval/tiny-cpu.yaml``)::

    name: tiny-cpu
    allow_beyond_context: true
    perplexity: {data: "builtin:stdlib", lengths: ["1x", "2x"], bucket_size: auto, context_limits: [32]}
    passkey: {lengths: ["1x"], depths: [0, 50, 100], trials: 2}
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ctxext.errors import InputError

# Lengths resolve the same way in every section (ctxext.evaluation.lengths); the sections themselves,
# settings models included, are registered in ctxext.evaluation.sections.
from ctxext.evaluation.lengths import Length, check_far_lengths, resolve_lengths


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Suite(_Section):
    """An evaluation suite: its name, and one key per section registered in ``ctxext.evaluation.sections``.

    Each registered section is an attribute (``suite.passkey``): its validated settings, or None.
    """

    model_config = ConfigDict(extra="allow")

    name: str
    description: str = ""
    allow_beyond_context: bool = False

    @model_validator(mode="wrap")
    @classmethod
    def _registered_sections(cls, data: Any, handler: Any) -> Suite:
        # Keys beyond the fields above must be registered sections, each validated by its own settings model.
        if not isinstance(data, dict):
            return handler(data)
        from pydantic_core import InitErrorDetails

        from ctxext.evaluation.sections import SECTIONS

        problems: list[InitErrorDetails] = []
        sections: dict[str, Any] = {}
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            if key not in SECTIONS:
                problems.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
                continue
            try:
                sections[key] = SECTIONS[key].settings.model_validate(value or {})
            except ValidationError as exc:
                problems += [
                    InitErrorDetails(type=e["type"], loc=(key, *e["loc"]), input=e.get("input"), ctx=e.get("ctx", {}))
                    for e in exc.errors()
                ]
        try:
            suite = handler({k: v for k, v in data.items() if k in cls.model_fields})
        except ValidationError as exc:
            problems = [
                InitErrorDetails(type=e["type"], loc=e["loc"], input=e.get("input"), ctx=e.get("ctx", {}))
                for e in exc.errors()
            ] + problems
            raise ValidationError.from_exception_data(cls.__name__, problems) from None
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        if suite.__pydantic_extra__ is not None:
            # Every registered section is an attribute, None when the suite does not name it, in the registry's
            # order (the order sections run in, and the order of report.json's suite definition and data).
            suite.__pydantic_extra__.clear()
            suite.__pydantic_extra__.update({key: sections.get(key) for key in SECTIONS})
        return suite


def load_suite(path: str | Path, overrides: list[str] | None = None) -> tuple[Suite, dict[str, Any]]:
    """Read and validate a suite; ``overrides`` are ``key=value`` (dotted keys, YAML values).

    Args:
        path: the YAML file.
        overrides: e.g. ``["perplexity.data=emozilla/pg19-test", "passkey.trials=10"]``.

    Returns:
        ``(suite, raw)``.

    Raises:
        InputError: a missing file, bad YAML, or invalid fields (all problems named by key).
    """
    p = Path(path)
    if not p.is_file():
        shipped = Path(__file__).resolve().parents[2] / "eval"
        hint = (
            f"; shipped suites: {', '.join(sorted(x.name for x in shipped.glob('*.yaml')))}" if shipped.is_dir() else ""
        )
        what = "is a folder, not a suite YAML file" if p.is_dir() else "does not exist"
        raise InputError(f"suite file {path} {what}{hint}")
    from ctxext.recipe.yamlfile import read_yaml

    try:
        raw = read_yaml(p) or {}  # a key given twice is an error, as in recipes
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    from ctxext.recipe.schema import RecipeError, apply_overrides

    try:
        apply_overrides(raw, list(overrides or []))  # the one key=value parser, shared with recipes
    except RecipeError as exc:
        raise InputError("suite overrides: " + "; ".join(f"{k}: {m}" for k, m in exc.problems)) from None
    try:
        # Paths may be relative to the suite's folder or its parent (_resolve_paths): validators check them there.
        folder = p.resolve().parent
        suite = Suite.model_validate(raw, context={"folders": [folder, folder.parent]})
    except ValidationError as exc:
        problems = "\n".join(f"  {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InputError(f"invalid suite {path}:\n{problems}") from None
    _resolve_paths(suite, p.resolve().parent)
    from ctxext.evaluation.sections import SECTIONS, sections_in

    if not sections_in(suite):
        names = ", ".join(SECTIONS)
        raise InputError(f"suite {path} names no task ({names})")
    for registered, settings in sections_in(suite):
        registered.check(settings)  # e.g. unknown tasks fail now, before any model is loaded
    return suite, raw


def single_section_suite(section: str, settings: BaseModel, name: str | None = None) -> Suite:
    """A suite holding one registered section: what each ``ctxext eval <section>`` command runs.

    Args:
        section: the registered section's name.
        settings: its validated settings (the command's flags).
        name: the suite's name in the report (default: ``eval <section>``).

    Returns:
        The suite; its ``allow_beyond_context`` is the section's own key where it has one.

    Raises:
        InputError: what the section's :meth:`~ctxext.evaluation.sections.base.SuiteSection.check` refuses, before
            any model is loaded.
    """
    from ctxext.evaluation.sections import get_section

    registered = get_section(section)
    beyond = bool(getattr(settings, "allow_beyond_context", False))
    suite = Suite.model_validate({"name": name or f"eval {section}", "allow_beyond_context": beyond, section: settings})
    registered.check(settings)
    return suite


def _resolve_paths(suite: Suite, folder: Path) -> None:
    # Data paths in a suite may be relative to the working folder, the suite's folder or its parent.
    from ctxext.evaluation.sections import sections_in

    for registered, section in sections_in(suite):
        for key in registered.data_keys:
            _resolve_path(section, key, folder)


def _resolve_path(section: Any, key: str, folder: Path) -> None:
    value = getattr(section, key)
    if not isinstance(value, str) or value.startswith("builtin:") or value == "noise" or Path(value).exists():
        return
    for base in (folder, folder.parent):
        if (base / value).exists():
            setattr(section, key, str(base / value))
            return


def run_suite(
    suite: Suite,
    specs: list[Any],
    out: str | Path,
    suite_path: str | None = None,
    show_progress: bool = True,
    allow_beyond_for: set[int] | None = None,
    command: str | None = None,
    device: str | None = None,
    overwrite: bool = False,
    reference: str | None = None,
) -> dict[str, Any]:
    """Run every task of a suite on every model (one model in memory at a time) and write the report.

    Args:
        suite: the validated suite.
        specs: :class:`~ctxext.models.load.ModelSpec` list.
        out: report folder.
        suite_path: for the report.
        show_progress: progress bars.
        allow_beyond_for: indices of models evaluated past their context without error (comparisons).
        command: the command line, for the report.
        device: ``cpu`` / ``cuda``.
        overwrite: replace a previous report folder at ``out`` (never anything else).
        reference: report label of the model the others are compared with, paired (default: the first).

    Returns:
        The report dict (also written to ``out``).
    """
    from ctxext.artifacts.lock import folder_lock
    from ctxext.atomic import check_inputs_outside, check_output
    from ctxext.evaluation.report import REPORT_KIND, write_report
    from ctxext.models.load import load_model

    # Before any work: an output that cannot be written must not cost an evaluation.
    check_inputs_outside(out, [p for s in specs for p in (s.ref, s.adapter, s.config_from) if p], report=True)
    check_output(out, REPORT_KIND, overwrite)
    with folder_lock(out):  # one writer per folder, from the first check to the last write
        original, context = _reference_context(specs)
        allow = suite.allow_beyond_context
        plan, notes = _length_plan(suite, original, context)

        # Lengths past the reference's context were asked for explicitly ("2x target"): every model goes there.
        beyond_target = sorted({L for v in plan.values() for L in (v[0] if isinstance(v, tuple) else v) if L > context})
        from ctxext.evaluation.sections import SuiteRun, sections_in

        registered_sections = sections_in(suite)
        labels = tuple(s.label() for s in specs)
        chat = _chat_decision(registered_sections, specs, reference)
        run_info = SuiteRun(labels, original, context, reference, refs=tuple(str(s.ref) for s in specs), chat=chat)
        for registered, settings in registered_sections:
            registered.begin(settings, run_info)
        entries: list[dict[str, Any]] = []
        current: dict[str, Any] = {}  # the model being evaluated: its sections so far
        try:
            for i, spec in enumerate(specs):
                loaded = load_model(spec, device=device)
                beyond_ok = (
                    allow
                    or bool(beyond_target)
                    or (allow_beyond_for is not None and i in allow_beyond_for)
                    or loaded.context_length < context
                )
                current = _run_tasks(suite, loaded, plan, beyond_ok, show_progress, spec)
                entries.append(current)
                current = {}
                del loaded
                gc.collect()
        except KeyboardInterrupt as stop:
            # Ctrl-C, or SIGTERM from a scheduler: what is complete is written, marked as such, and the stop goes on.
            kept, missing = _complete_part(entries, getattr(stop, "entry", current), registered_sections, labels)
            if kept:
                sections = [(r, s) for r, s in registered_sections if r.name in kept[0]]
                interrupted = f"stopped by {str(stop) or 'Ctrl-C'}; not evaluated: {', '.join(missing)}"
                report = _report(suite, suite_path, sections, kept, plan, notes, beyond_target, context, original,
                                 command, reference, interrupted)  # fmt: skip
                write_report(report, out, overwrite=overwrite)
                print(f"{out}: what completed before the stop ({interrupted})", file=sys.stderr)
            raise
        report = _report(suite, suite_path, registered_sections, entries, plan, notes, beyond_target, context,
                         original, command, reference)  # fmt: skip
        write_report(report, out, overwrite=overwrite)
        return report


def _report(
    suite: Suite,
    suite_path: str | None,
    sections: list[tuple[Any, Any]],
    entries: list[dict[str, Any]],
    plan: dict[str, Any],
    notes: list[str],
    beyond_target: list[int],
    context: int,
    original: int,
    command: str | None,
    reference: str | None,
    interrupted: str | None = None,
) -> dict[str, Any]:
    """The report of ``entries``: each section's cross-model part (``finish``), the suite's record, the comparisons.

    ``interrupted`` (what stopped the evaluation and what it did not reach) marks a report of what completed.
    """
    from ctxext.evaluation.report import build_report

    for registered, settings in sections:
        registered.finish(settings, entries)
    suite_info = {
        "name": suite.name,
        "path": suite_path,
        "reference_context": context,
        "reference_original_context": original,
        "beyond_target": beyond_target,
        "notes": notes,
        "definition": suite.model_dump(),
        **({"interrupted": interrupted} if interrupted else {}),
    }
    labels = {e["name"] for e in entries}
    reference = reference if reference in labels else None
    return build_report(entries, data=_data_sources(suite), suite=suite_info, command=command, reference=reference)


def _complete_part(
    entries: list[dict[str, Any]], current: dict[str, Any], sections: list[tuple[Any, Any]], labels: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[str]]:
    """What an interrupted evaluation completed: ``(entries to report, what is missing)``.

    The models evaluated whole; when none is, the model in progress with the sections it finished (a model cut
    short beside whole ones is left out: a comparison needs every section on both sides).
    """
    names = [r.name for r, _ in sections]
    finished = [n for n in names if n in current]
    if entries:
        kept = entries
        missing = []
    elif finished:
        kept = [current]
        missing = [f"{n} ({current['name']})" for n in names if n not in finished]
    else:
        return [], []
    done = {e["name"] for e in kept}
    return kept, missing + [label for label in labels if label not in done]


def _chat_decision(sections: list[tuple[Any, Any]], specs: list[Any], reference: str | None) -> Any:
    """``chat_template: auto`` decided once, from the paired reference (else the first model), for every model.

    ``None`` when no section asks for ``auto``. Paired trials need the same prompts for every model.
    """
    if not any(getattr(settings, "chat_template", None) == "auto" for _, settings in sections):
        return None
    from ctxext.evaluation.settings import decide_chat

    spec = next((s for s in specs if reference is not None and s.label() == reference), specs[0])
    return decide_chat(str(spec.ref), spec.label() if len(specs) > 1 else "")


def _reference_context(specs: list[Any]) -> tuple[int, int]:
    """``(original, context)`` of the model with the longest configured context, read from configs only.

    That model sets the lengths a suite gives relative to a context (``2x original``, ``target``).
    """
    from ctxext.artifacts.run import is_run_folder
    from ctxext.models.sources import load_config
    from ctxext.rope.read import read_rope

    states = []
    for spec in specs:
        cfg_ref = spec.config_from or spec.ref
        if spec.adapter and not spec.config_from:
            if (Path(spec.adapter) / "config.json").is_file():
                cfg_ref = spec.adapter
        elif is_run_folder(spec.ref):
            cfg_ref = spec.ref
        config, _ = load_config(str(cfg_ref))
        states.append(read_rope(config))
    ref_state = max(states, key=lambda s: s.current_length)
    return ref_state.original_length, ref_state.current_length


def _length_plan(suite: Suite, original: int, context: int) -> tuple[dict[str, Any], list[str]]:
    """The lengths in tokens of every section (resolved against the reference model), with notes.

    Raises:
        InputError: a section with no length left at or below the reference context.
    """
    notes: list[str] = []

    def lengths_of(values: list[Length], task: str) -> list[int]:
        kept, dropped = resolve_lengths(values, original, context, suite.allow_beyond_context)
        if dropped:
            notes.append(f"{task}: lengths {dropped} dropped (above the reference context {context})")
        if not kept:
            raise InputError(f"{task}: no length left at or below the reference context {context}")
        check_far_lengths(kept, context, suite.allow_beyond_context, task)
        return kept

    plan: dict[str, Any] = {}
    from ctxext.evaluation.sections import sections_in

    for registered, settings in sections_in(suite):
        asked = registered.lengths(settings)
        plan[registered.name] = lengths_of(asked, registered.name) if asked else []
    return plan, notes


def _data_sources(suite: Suite) -> dict[str, Any]:
    """What each section reads (:func:`~ctxext.scoring.texts.describe_source`), for the report."""
    data: dict[str, Any] = {}
    from ctxext.evaluation.sections import sections_in

    for registered, settings in sections_in(suite):
        described = registered.describe_data(settings)
        if described:
            data[registered.name] = described
    return data


def _run_tasks(
    suite: Suite, loaded: Any, plan: dict[str, Any], beyond_ok: bool, show: bool, spec: Any
) -> dict[str, Any]:
    """One model's entry, section by section; an interruption leaves the finished sections in the entry raised with.

    Raises:
        KeyboardInterrupt: a stop (its ``entry`` attribute: the sections finished so far).
    """
    from ctxext.evaluation.report import model_entry
    from ctxext.evaluation.sections import sections_in

    entry = model_entry(loaded)
    try:
        for registered, settings in sections_in(suite):
            part = registered.run(loaded, settings, plan[registered.name], beyond_ok, show)
            registered.annotate(part, spec)
            entry[registered.name] = part
    except KeyboardInterrupt as stop:
        stop.entry = entry  # type: ignore[attr-defined]
        raise
    return entry


def find_suite(ref: str | Path) -> Path:
    """A recipe's ``eval.suite``: a path as given, else relative to the ctxext checkout (``eval/tiny-cpu.yaml``)."""
    suite_path = Path(ref)
    if not suite_path.is_file():
        shipped = Path(__file__).resolve().parents[2] / suite_path
        suite_path = shipped if shipped.is_file() else suite_path
    return suite_path


def run_suite_for_run(run_dir: str | Path, recipe: Any, show_progress: bool = True) -> Path:
    """Evaluate a finished training run with its recipe's suite; the report goes to ``<run_dir>/eval/``.

    Called by ``ctxext train`` at the end of training when ``recipe.eval.suite`` is set. With
    ``recipe.eval.compare_base`` the base model and the patched-only model (base weights with the run's
    patched config, no adapter) are evaluated on the same data, side by side.

    Args:
        run_dir: the run folder (``run.json``, adapter, patched ``config.json``).
        recipe: the run's :class:`ctxext.recipe.schema.Recipe`.
        show_progress: progress bars.

    Returns:
        The report folder.
    """
    from ctxext.artifacts.run import run_base_model
    from ctxext.models.load import ModelSpec

    run_dir = Path(run_dir)
    suite_ref = recipe.eval.suite
    if not suite_ref:
        raise InputError("recipe eval.suite is not set")
    suite_path = find_suite(suite_ref)
    suite, _ = load_suite(suite_path)
    specs = [ModelSpec(ref=str(run_dir), name="fine-tuned")]
    allow: set[int] = set()
    if getattr(recipe.eval, "compare_base", False):
        base = run_base_model(run_dir)
        specs = [
            ModelSpec(ref=base, name="base"),
            ModelSpec(ref=base, config_from=str(run_dir), name="patched only"),
            *specs,
        ]
        allow = {0, 1}
    out = run_dir / "eval"
    run_suite(
        suite, specs, out, str(suite_path), show_progress, allow, command=f"ctxext train (eval suite {suite_ref})"
    )
    return out
