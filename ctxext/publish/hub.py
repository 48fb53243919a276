"""Publishing to the Hugging Face Hub: ``ctxext push``.

What is uploaded is first *staged*: a ``hub/`` folder inside the run (or merged) folder receives hard
links to exactly the files that go to the repository, the generated ``README.md`` model card and the
evaluation plots. ``--dry-run`` stops there and lists it; a real push uploads that folder with
``HfApi.upload_folder`` as one commit (huggingface_hub handles large files). A failure before or during
the commit leaves the repository without a new commit and never touches the run's own files.

Errors a user can fix (not logged in, Hub offline, unreachable or refusing, an unfinished run) are
raised as :class:`~ctxext.errors.CtxextError` with a message that names the endpoint and says what to do.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.artifacts.run import (
    Report,
    RunRecord,
    find_reports,
    is_full_run,
    is_merged_folder,
    is_run_folder,
    load_report,
    read_merged,
    read_run,
)
from ctxext.atomic import OUTPUT_MARKER, atomic_folder
from ctxext.errors import CtxextError, InputError
from ctxext.models.refs import is_hub_id
from ctxext.models.sources import exception_chain
from ctxext.models.temperature import CALIBRATION_FILE, run_temperature
from ctxext.models.weights import RUN_DAMAGED, check_file_readable, check_run_base, weight_files

__all__ = ["PushPlan", "PushResult", "plan_push", "push", "push_run", "read_run", "stage"]

STAGING_DIR = "hub"

# Files that make up a model or adapter besides its weights, uploaded when present.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
_COMMON_FILES = ("config.json", "generation_config.json", *_TOKENIZER_FILES, "recipe.yaml", "versions.json")
# Exception class names (anywhere in the cause chain) that mean "could not reach the endpoint".
_UNREACHABLE = {
    "ConnectError",
    "ConnectTimeout",
    "ConnectionError",
    "NetworkError",
    "ReadTimeout",
    "TimeoutException",
    "TransportError",
    "RemoteProtocolError",
    "ProxyError",
}


class HubError(CtxextError):
    """The Hub could not be used: not logged in, offline, unreachable, or it refused the request."""


@dataclass
class PushPlan:
    """What a push sends, and where.

    Attributes:
        source: the run or merged folder being published.
        staging: the staged folder (``<source>/hub``) that is uploaded as is.
        repo_id: the target repository.
        revision: the target branch (``None``: the default branch).
        private: create the repository as private.
        merged: a merged model rather than an adapter.
        files: ``(path in repo, size in bytes)`` of every staged file, sorted.
        endpoint: the Hub endpoint.
    """

    source: Path
    staging: Path
    repo_id: str
    revision: str | None
    private: bool
    merged: bool
    files: list[tuple[str, int]] = field(default_factory=list)
    endpoint: str = ""

    @property
    def total_bytes(self) -> int:
        """Bytes to upload."""
        return sum(size for _, size in self.files)

    def describe(self) -> str:
        """A human listing: the target and every file with its size."""
        kind = "merged model" if self.merged else "LoRA adapter"
        where = f"{self.endpoint.rstrip('/')}/{self.repo_id}"
        lines = [
            f"target: {where} ({'private' if self.private else 'public'}, "
            f"{'branch ' + self.revision if self.revision else 'default branch'}), {kind} from {self.source}",
            f"staged in {self.staging}: {len(self.files)} files, {human_size(self.total_bytes)}",
        ]
        width = max((len(name) for name, _ in self.files), default=0)
        lines += [f"  {name:<{width}}  {human_size(size):>10}" for name, size in self.files]
        return "\n".join(lines)


@dataclass
class PushResult:
    """The outcome of :func:`push`.

    Attributes:
        plan: what was (or would have been) sent.
        dry_run: nothing was sent.
        commit_url: the commit created on the Hub.
    """

    plan: PushPlan
    dry_run: bool
    commit_url: str | None = None


def human_size(n: int) -> str:
    """``1234567`` → ``'1.2 MB'``."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def check_repo_id(repo_id: str) -> str:
    """Validate a ``USER/NAME`` repository id.

    Raises:
        InputError: the id is not ``namespace/name``.
    """
    from ctxext.recipe.sections import repo_id_problem

    problem = repo_id_problem(repo_id)
    if problem:
        raise InputError(f"--repo-id {problem}")
    return repo_id


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _adapter_config_for_hub(src: Path, base_model: str | None) -> str:
    # A run records the base it loaded, often a local folder; the published adapter must name the Hub id.
    data = json.loads(src.read_text())
    if is_hub_id(base_model):
        data["base_model_name_or_path"] = base_model
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _resolve_source(
    run_or_dir: Path, merged: bool, force: bool, log: Callable[[str], None]
) -> tuple[Path, RunRecord, bool]:
    # (folder to publish, the run's record, merged?)
    if is_merged_folder(run_or_dir):
        return run_or_dir, read_merged(run_or_dir).run, True
    if is_full_run(run_or_dir) and not merged:
        # A full fine-tune has no adapter: what it publishes is the model, merged (checked, calibrated) first.
        log(f"{run_or_dir} is a full fine-tune: publishing the whole model (as with --merged)")
        merged = True
    if not is_run_folder(run_or_dir) and not is_full_run(run_or_dir):
        raise InputError(
            f"{run_or_dir} is neither a ctxext run folder (run.json + adapter) nor a folder written by "
            "`ctxext merge` (ctxext_merge.json); pass one of those"
        )
    run = read_run(run_or_dir, allow_incomplete=force)
    check_run_base(run, "push")
    if not merged:
        if not (run_or_dir / "adapter_config.json").is_file():
            raise InputError(f"run {run_or_dir} has no adapter_config.json: there is no adapter to publish")
        temperature = run_temperature(run_or_dir)
        if temperature != 1.0:
            # peft and vLLM load an adapter without it: the published model would not be the calibrated one.
            raise InputError(
                f"{run_or_dir}/{CALIBRATION_FILE}: the run is calibrated to attention temperature {temperature:g}, "
                "which an adapter cannot carry; publish the merged model (--merged), whose weights carry it"
            )
        return run_or_dir, run, False
    target = run_or_dir / "merged"
    if is_merged_folder(target):
        log(f"using the merged model in {target} (delete it to merge again)")
    elif target.exists() and (not target.is_dir() or any(target.iterdir())):
        # merge_run's own advice (--overwrite, another --out) names options push does not have.
        raise InputError(
            f"--merged: {target} exists and is not a model `ctxext merge` wrote, so push will not merge into it. "
            f"Move it away, or merge elsewhere (`ctxext merge {shlex.quote(str(run_or_dir))} --out DIR`) and push DIR."
        )
    else:
        from ctxext.publish.merge import merge_run

        log(f"merging {run_or_dir} into {target} first")
        merge_run(run_or_dir, target, allow_incomplete=force, log=log)
    return target, run, True


def _files_to_publish(folder: Path, merged: bool) -> list[Path]:
    names = [*(() if merged else _ADAPTER_FILES), *_COMMON_FILES]
    files = [folder / n for n in names if (folder / n).is_file()]
    if merged:
        weights = weight_files(folder, with_index=True)
        if not weights:
            raise InputError(f"{folder} has no model weights (*.safetensors); merge the run again with `ctxext merge`")
        files += weights
    elif not any(f.name.startswith("adapter_model") for f in files):
        raise InputError(f"{folder} has no adapter weights (adapter_model.safetensors): the run saved no adapter")
    # Every file is checked whole before it is staged: a truncated upload is worse than none.
    fix = "Merge the run again with `ctxext merge`." if merged else RUN_DAMAGED
    for path in files:
        check_file_readable(path, fix)
    return files


def stage(
    folder: Path,
    run: RunRecord,
    reports: list[Report],
    merged: bool,
    repo_id: str,
    smoke: dict[str, Any] | None = None,
) -> tuple[Path, list[tuple[str, int]]]:
    """Write the staging folder ``<folder>/hub``: links to the files to upload, the model card and the plots.

    Built in a temporary sibling and renamed, so an existing staging folder is replaced whole.

    Args:
        folder: the adapter (run) folder or merged model folder.
        run: the run's record.
        reports: evaluation reports to publish with the card.
        merged: publishing a merged model.
        repo_id: the target repository (for the card's snippets).
        smoke: the merge smoke test results (merged models).

    Returns:
        ``(staging folder, [(path in repo, size), ...])``.
    """
    from ctxext.publish.card import card_inputs, render_card

    files = _files_to_publish(folder, merged)
    inputs = card_inputs(folder, run, reports, smoke)
    card = render_card(inputs, merged=merged, repo_id=repo_id)
    staging = folder / STAGING_DIR
    # Replaced on every push, but only when ctxext staged it: a user's own ``hub/`` folder is refused.
    with atomic_folder(staging, kind="hub-staging", overwrite=True, flag="staging folder") as tmp:
        for src in files:
            if src.name == "adapter_config.json":
                (tmp / src.name).write_text(_adapter_config_for_hub(src, run.base_model))
            else:
                _link_or_copy(src, tmp / src.name)
        for plot, name in inputs.plot_names.items():
            _link_or_copy(plot, tmp / name)
        for i, report in enumerate(reports):
            sub = Path("eval") if i == 0 else Path("eval") / report.label
            _link_or_copy(report.path, tmp / sub / "report.json")
            md = report.path.with_suffix(".md")
            if md.is_file():
                _link_or_copy(md, tmp / sub / "report.md")
        (tmp / "README.md").write_text(card)
    listing = sorted(
        (p.relative_to(staging).as_posix(), p.stat().st_size)
        for p in staging.rglob("*")
        if p.is_file() and p.name != OUTPUT_MARKER
    )
    return staging, listing


def plan_push(
    run_or_dir: str | Path,
    repo_id: str,
    private: bool = True,
    revision: str | None = None,
    merged: bool = False,
    force: bool = False,
    report: list[str | Path] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[PushPlan, RunRecord]:
    """Check the inputs and stage what a push would send (the ``--dry-run`` part of a push).

    Args:
        run_or_dir: a run folder, or a folder written by ``ctxext merge``.
        repo_id: ``USER/NAME``.
        private: create the repository as private.
        revision: the branch to push to.
        merged: publish the merged model (a run is merged into ``<run>/merged`` first).
        force: accept an unfinished run.
        report: extra ``report.json`` files; the folder's own ``eval/`` reports are always included.
        log: where progress lines go.

    Returns:
        ``(plan, the run's record)``.
    """
    check_repo_id(repo_id)
    source = Path(run_or_dir)
    if not source.exists():
        raise InputError(f"{source} does not exist; pass a run folder or a merged model folder")
    folder, run, merged = _resolve_source(source, merged, force, log)
    reports = find_reports(folder)
    if not reports and folder != source:
        reports = find_reports(source)
    known = {r.path.resolve() for r in reports}
    for path in report or []:
        extra = load_report(path)
        if extra.path.resolve() not in known:
            reports.append(extra)
    smoke = read_merged(folder).smoke if merged else None
    staging, files = stage(folder, run, reports, merged, repo_id, smoke)
    plan = PushPlan(
        source=folder,
        staging=staging,
        repo_id=repo_id,
        revision=revision,
        private=private,
        merged=merged,
        files=files,
        endpoint=_endpoint(),
    )
    return plan, run


def hub_failure(exc: BaseException, endpoint: str, repo_id: str) -> HubError | None:
    """Translate a huggingface_hub / HTTP exception into a message a user can act on.

    Args:
        exc: what huggingface_hub raised.
        endpoint: the Hub endpoint used.
        repo_id: the target repository.

    Returns:
        A :class:`HubError`, or ``None`` for an exception that is not about reaching or using the Hub.
    """
    chain = exception_chain(exc)
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    tail = f"Nothing was committed to {repo_id}; the local files are unchanged."
    if "OfflineModeIsEnabled" in names:
        return HubError(f"cannot push to {endpoint}: HF_HUB_OFFLINE=1 is set. Unset it to publish. {tail}")
    if "HfHubHTTPError" in names:
        http = next(e for e in chain if "HfHubHTTPError" in {c.__name__ for c in type(e).__mro__})
        response = getattr(http, "response", None)
        status = getattr(response, "status_code", None)
        first_line = str(http).strip().splitlines()[0] if str(http).strip() else type(http).__name__
        if http is not exc and str(exc).strip():
            # huggingface_hub re-raises some refusals with the Hub's own explanation (e.g. invalid card metadata).
            first_line = " ".join(str(exc).split())
        if status == 401:
            advice = "the token was rejected: log in again with `hf auth login` or set a valid HF_TOKEN."
        elif status == 403:
            advice = (
                f"the token may not write to {repo_id}: use a token with write access (fine-grained tokens need "
                "write permission on that namespace), or push to your own namespace."
            )
        elif status == 404:
            advice = "the repository, namespace or branch was not found: check --repo-id and --revision."
        else:
            advice = "check --repo-id, --revision and your token."
        return HubError(f"the Hub at {endpoint} refused the push ({status or 'error'}: {first_line}); {advice} {tail}")
    if names & _UNREACHABLE:
        reason = str(next((e for e in chain if type(e).__name__ in _UNREACHABLE), exc)) or type(exc).__name__
        return HubError(
            f"the Hub at {endpoint} is unreachable ({reason}). Check the network connection, a proxy, or the "
            f"HF_ENDPOINT variable. {tail}"
        )
    return None


def _token_or_fail(endpoint: str) -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise HubError(
            f"not logged in to the Hub ({endpoint}): run `hf auth login` (or `huggingface-cli login`), or set "
            "HF_TOKEN to a token with write access (https://huggingface.co/settings/tokens). Nothing was uploaded."
        )
    return token


def push(
    run_or_dir: str | Path,
    repo_id: str,
    private: bool = True,
    revision: str | None = None,
    merged: bool = False,
    dry_run: bool = False,
    force: bool = False,
    report: list[str | Path] | None = None,
    commit_message: str | None = None,
    log: Callable[[str], None] = print,
) -> PushResult:
    """Publish a run's adapter (or its merged model) with a generated model card, as one commit.

    Args:
        run_or_dir: a run folder, or a folder written by ``ctxext merge``.
        repo_id: ``USER/NAME``; created if missing.
        private: create the repository as private (an existing repository keeps its visibility).
        revision: the branch to push to, created from the default branch if missing.
        merged: publish the merged model (a run is merged into ``<run>/merged`` first, smoke test included).
        dry_run: stage and list the files, write the card, send nothing.
        force: publish an unfinished run.
        report: extra evaluation reports for the card.
        commit_message: the commit message.
        log: where progress lines go.

    Returns:
        The :class:`PushResult`.

    Raises:
        IncompleteRunError: an unfinished run without ``force``.
        HubError: not logged in, offline, unreachable or refused.
        InputError: a bad repository id, folder or report.
    """
    plan, run = plan_push(run_or_dir, repo_id, private, revision, merged, force, report, log)
    if not plan.merged and not is_hub_id(run.base_model):
        log(
            f"note: the run's base model {run.base_model!r} is not a Hub id, so users of the adapter cannot "
            "fetch it; the card says so. Publish the merged model (--merged) or train from a Hub model."
        )
    if dry_run:
        log(plan.describe())
        log(f"dry run: model card written to {plan.staging / 'README.md'}; nothing was sent")
        return PushResult(plan=plan, dry_run=True)

    from huggingface_hub import HfApi, constants

    endpoint = plan.endpoint
    if constants.is_offline_mode():
        raise HubError(
            f"cannot push to {endpoint}: HF_HUB_OFFLINE=1 is set. Unset it to publish. Nothing was uploaded."
        )
    token = _token_or_fail(endpoint)
    api = HfApi(endpoint=endpoint, token=token)
    message = commit_message or (
        f"ctxext: {run.method} {run.original_length}→{run.target_length} {'merged model' if plan.merged else 'adapter'}"
    )
    log(plan.describe())
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=plan.staging,
            revision=revision,
            commit_message=message,
            repo_type="model",
            # ctxext's record of which staged files it wrote stays local.
            ignore_patterns=[OUTPUT_MARKER],
        )
    except Exception as exc:  # huggingface_hub raises many types; translate those a user can fix
        failure = hub_failure(exc, endpoint, repo_id)
        if failure is not None:
            raise failure from None
        raise
    url = str(getattr(info, "commit_url", info))
    log(f"pushed {len(plan.files)} files to {endpoint.rstrip('/')}/{repo_id}: {url}")
    return PushResult(plan=plan, dry_run=False, commit_url=url)


def push_run(run_dir: str | Path, hub_section: Any, log: Callable[[str], None] = print) -> PushResult | None:
    """Push at the end of ``ctxext train`` when the recipe's ``hub.push`` is true.

    Call it after ``run.json`` says ``complete`` and the evaluation report is in ``<run>/eval``.

    Args:
        run_dir: the finished run folder.
        hub_section: the recipe's :class:`~ctxext.recipe.schema.HubSection` (``repo_id``, ``private``, ``revision``,
            ``merged``, ``push``).
        log: where progress lines go.

    Returns:
        The :class:`PushResult`, or ``None`` when ``hub.push`` is false.
    """
    if not getattr(hub_section, "push", False):
        return None
    if not getattr(hub_section, "repo_id", None):
        raise InputError("hub.repo_id: required when hub.push is true")
    return push(
        run_dir,
        hub_section.repo_id,
        private=bool(getattr(hub_section, "private", True)),
        revision=getattr(hub_section, "revision", None),
        merged=bool(getattr(hub_section, "merged", False)),
        log=log,
    )
