"""A training mixture: weighted real corpora and synthetic long-range tasks, plus short blocks.

``data.mixture`` lists sources, each a corpus (read by :mod:`ctxext.training.data.corpus`, the one data reader) or a
task of the :mod:`ctxext.tasks` registry, with a weight. Training consumes exactly
``max_steps × gradient_accumulation_steps × micro_batch_size × processes`` rows; this module builds
that many rows up front, deterministically from the seed (so a resumed run rebuilds the same rows and
skips the ones already trained on):

* ``short_fraction`` of the rows are made of blocks at the model's *original* length, cut from the
  corpus sources and packed side by side as separate segments (own positions from 0, no attention
  across them): short data at its own scale, which keeps the model good at short range (ProLong
  keeps ~40 % short data).
* the rest is split over the sources by weight (largest remainder). A corpus row is one of the
  corpus's ``seq_len`` blocks (``long_fraction``: that share drawn from blocks of documents at least
  ``seq_len`` long — up-sampling long documents within the source, Fu et al. 2024). A task row is
  filled with task samples, each its own segment, whose needle-to-question distances follow
  ``data.task_distance`` over the whole row (with PoSE, the whole target length):
  :mod:`ctxext.training.data.task_rows`.

Nothing a row holds comes from validation text: short blocks and task haystacks are cut from the
training split's documents (within ``max_documents``), and corpora after the first leave the first
corpus's validation documents out.

The realised mixture (rows and tokens per source, samples per task and template, the needle-distance
histogram) is returned for ``mixture.json`` and ``run.json``.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

from ctxext.errors import InputError
from ctxext.tasks import HAYSTACK_MIN_TOKENS
from ctxext.training.data.corpus import (
    PoseRows,
    TrainingData,
    document_blocks,
    prepare_data,
    select_documents,
    text_digest,
)

if TYPE_CHECKING:
    from ctxext.training.data.task_rows import DistanceDraws


def allocate(n: int, weights: list[float]) -> list[int]:
    """Split ``n`` rows over ``weights`` by largest remainder (deterministic, sums to ``n``)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def _corpus_section(data: Any, source: Any) -> Any:
    """The ``data`` section as the data reader wants it, for one corpus source."""
    return data.model_copy(
        update={
            "path": source.path,
            "text_field": source.text_field,
            "max_documents": source.max_documents if source.max_documents is not None else data.max_documents,
            "mixture": None,
            "short_fraction": 0.0,
        }
    )


def _short_rows(blocks: Any, n_rows: int, seq_len: int, short_len: int, rng: random.Random) -> list[dict]:
    """``n_rows`` rows, each ``seq_len // short_len`` (+ a partial) short blocks as separate segments."""
    ids = blocks.with_format(None)["input_ids"]
    order: list[int] = []
    rows = []
    for _ in range(n_rows):
        toks: list[int] = []
        segs: list[int] = []
        seg = 0
        while len(toks) < seq_len:
            if not order:
                order = list(range(len(ids)))
                rng.shuffle(order)
            block = list(ids[order.pop()])[: seq_len - len(toks)]
            toks += block
            segs += [seg] * len(block)
            seg += 1
        rows.append({"input_ids": toks, "segments": segs, "targets": [1] * seq_len, "pose": 0})
    return rows


def _corpus_rows(
    blocks: Any, n_rows: int, seq_len: int, long_fraction: float | None, rng: random.Random
) -> tuple[list[dict], int]:
    """``n_rows`` of the corpus's blocks, without replacement until they run out, and how many are long."""
    blocks = blocks.with_format(None)  # plain lists, every column
    n = len(blocks)
    doc_tokens = blocks["doc_tokens"]
    long_ids = [i for i in range(n) if doc_tokens[i] >= seq_len]
    other = [i for i in range(n) if doc_tokens[i] < seq_len]
    pools: dict[str, list[int]] = {"long": [], "other": [], "all": []}
    chosen = []
    for _ in range(n_rows):
        if long_fraction is None or not long_ids or not other:
            kind, src = "all", list(range(n))
        else:
            kind = "long" if rng.random() < long_fraction else "other"
            src = long_ids if kind == "long" else other
        if not pools[kind]:
            pools[kind] = list(src)
            rng.shuffle(pools[kind])
        chosen.append(pools[kind].pop())
    has_segments = "segments" in blocks.column_names
    rows = []
    for i in chosen:
        row = blocks[i]
        segs = list(row["segments"]) if has_segments else [0] * seq_len
        rows.append({"input_ids": list(row["input_ids"]), "segments": segs, "targets": [1] * seq_len, "pose": 1})
        if "positions" in row:  # cut by the official PoSE sampling: its positions are drawn already
            rows[-1].update(positions=list(row["positions"]), pose=0)
    return rows, sum(1 for i in chosen if doc_tokens[i] >= seq_len)


def _task_rows(
    key: str, source: Any, tokenizer: Any, haystack: Any, count: int, recipe: Any, target: int | None, stats: Counter
) -> tuple[list[dict], DistanceDraws]:
    """``count`` rows of a task source and its distance draws (:mod:`ctxext.training.data.task_rows`)."""
    from ctxext.tasks import get_task
    from ctxext.training.data.task_rows import (
        DistanceDraws,
        Source,
        pose_distance_rows,
        token_distance_rows,
    )

    seq_len, seed = recipe.seq_len, recipe.train.seed
    task = get_task(source.task)
    longest = min(source.max_length or seq_len, seq_len)
    src = Source(
        key=key,
        task=task,
        templates=source.templates if source.templates is not None else task.training_templates(),
        options={} if source.distractors is None else {"distractors": source.distractors},
        answer_only=source.answer_only,
        min_length=min(source.min_length or seq_len, longest),
        max_length=longest,
    )
    target = target if recipe.train.pose is not None else None
    draws = DistanceDraws(
        kind=recipe.data.task_distance,
        span=target or longest,
        target_length=target,
        offset=random.Random(f"{seed}:{key}:distance").random(),
        placement=recipe.data.task_position,
    )
    build = pose_distance_rows if target else token_distance_rows
    rows = build(src, tokenizer, haystack, count, seq_len, seed, draws, stats) if count else []
    return rows, draws


def prepare_training_data(recipe: Any, tokenizer: Any, plan: Any, rows: int) -> TrainingData:
    """The training data of a recipe: one corpus (:func:`ctxext.training.data.corpus.prepare_data`) or a mixture.

    Args:
        recipe: the validated recipe.
        tokenizer: the model's tokenizer.
        plan: the RoPE plan (its ``original_length`` sizes the short blocks), or ``None``.
        rows: training rows the run consumes (all processes).

    Returns:
        The :class:`ctxext.training.data.corpus.TrainingData`; for a mixture, ``mixture`` records what it holds.

    Raises:
        InputError: unreadable sources, a task that cannot fit its length, short blocks without an
            original length.
    """
    data, seq_len, seed = recipe.data, recipe.seq_len, recipe.train.seed
    pose = _official_pose(recipe, plan)
    if data.mixture is None and data.short_fraction == 0:
        return prepare_data(data, tokenizer, seq_len, seed=seed, pose=pose)
    keyed = _keyed_sources(data)
    keys, sources = [k for k, _ in keyed], [s for _, s in keyed]
    original = plan.original_length if plan is not None else recipe.model.original_length
    if data.short_fraction > 0 and not original:
        raise InputError("data.short_fraction: needs the model's original length; set a rope method")
    rng = random.Random(seed)
    n_short = round(rows * data.short_fraction)
    if plan is not None and _length_dependent(plan):
        # Short rows train in micro-batches of their own (ctxext.training.steps): whole micro-batches of
        # each kind use every row once.
        size = recipe.train.micro_batch_size
        n_short = min(rows - rows % size, size * round(n_short / size))
    counts = allocate(rows - n_short, [s.weight for s in sources])
    corpus = [(k, s) for k, s in keyed if s.path]
    corpora, held_out = _prepare_corpora(data, corpus, tokenizer, seq_len, seed, pose)
    all_rows: list[dict] = []
    record: list[dict[str, Any]] = []
    for key, source, count in zip(keys, sources, counts, strict=True):
        entry: dict[str, Any] = {"source": source.path or f"task:{source.task}", "weight": source.weight, "rows": count}
        if source.path:
            made, long_rows = _corpus_rows(corpora[key].train, count, seq_len, source.long_fraction, rng)
            entry.update(blocks_available=len(corpora[key].train), rows_from_long_documents=long_rows)
        else:
            stats: Counter = Counter()
            hay_path = source.haystack or next((s.path for s in sources if s.path), data.path)
            haystack = _haystack(data, hay_path, corpus, corpora, held_out, tokenizer, count * seq_len)
            target = plan.target_length if plan is not None else None
            made, draws = _task_rows(key, source, tokenizer, haystack, count, recipe, target, stats)
            entry.update(
                task=source.task,
                haystack=hay_path,
                answer_only=source.answer_only,
                samples=dict(stats),
                distance=draws.summary(),
            )
        entry["tokens"] = count * seq_len
        all_rows += made
        record.append(entry)
    if n_short:
        made, entries = _short_block_rows(data, corpus, corpora, tokenizer, n_short, seq_len, original, rng)
        all_rows += made
        record += entries
    # Validation: the first corpus's held-out documents, at seq_len, plain positions.
    first = corpora[corpus[0][0]] if corpus else None
    train = _rows_dataset(all_rows, seq_len)
    summary = f"mixture of {len(all_rows)} rows of {seq_len} tokens: " + ", ".join(
        f"{e['source']} {e['rows']}" for e in record
    )
    realised = {
        "rows": len(all_rows),
        "seq_len": seq_len,
        "short_fraction": data.short_fraction,
        "task_distance": data.task_distance,
        "sources": record,
    }
    return TrainingData(
        train=train,
        validation=first.validation if first is not None else None,
        seq_len=seq_len,
        documents=sum(c.documents for c in corpora.values()),
        train_tokens=len(all_rows) * seq_len,
        summary=summary,
        mixture={"realised": realised},
        validation_documents=first.validation_documents if first is not None else None,
    )


def _short_block_rows(
    data: Any,
    corpus: list[tuple[str, Any]],
    corpora: dict[str, Any],
    tokenizer: Any,
    n_short: int,
    seq_len: int,
    original: int,
    rng: random.Random,
) -> tuple[list[dict], list[dict[str, Any]]]:
    """``n_short`` rows of short blocks (the original window), from the corpora in proportion to their weights."""
    rows: list[dict] = []
    record: list[dict[str, Any]] = []
    weighted = [(k, s) for k, s in corpus if s.weight > 0] or corpus
    per = allocate(n_short, [s.weight or 1.0 for _, s in weighted])
    for (key, source), count in zip(weighted, per, strict=True):
        # Cut from the corpus's own training documents: the validation documents stay out.
        short = document_blocks(corpora[key].train_documents, _corpus_section(data, source), tokenizer, original)
        if count and len(short) == 0:
            raise InputError(f"data.short_fraction: {source.path} makes no block of {original} tokens")
        rows += _short_rows(short, count, seq_len, original, rng)
        record.append(
            {"source": f"short:{source.path}", "block_tokens": original, "rows": count, "tokens": count * seq_len}
        )
    return rows, record


def _rows_dataset(all_rows: list[dict], seq_len: int) -> Any:
    """The mixture's rows as a torch-formatted ``datasets.Dataset``."""
    import datasets

    names = ["input_ids", "segments", "targets", "pose"]
    if any("positions" in r for r in all_rows):
        # Rows that carry their positions (task rows and official PoSE rows); -1: derived at training time.
        names.append("positions")
        for r in all_rows:
            r.setdefault("positions", [-1] * seq_len)
    columns = {k: [r[k] for r in all_rows] for k in names}
    train = datasets.Dataset.from_dict(columns)
    train.set_format("torch", columns=list(columns))
    return train


def preview_task_distances(recipe: Any, tokenizer: Any, rows: int = 64) -> dict[str, dict[str, Any]]:
    """The needle-distance record of each task source, from its first ``rows`` rows on a noise haystack.

    Distances depend on lengths, not on the filler's text, so ``ctxext validate`` shows them without reading
    any corpus.

    Raises:
        InputError: a distance span the rows cannot meet (naming ``data.task_distance``), a task that cannot fit.
    """
    return {key: draws.summary() for key, draws in preview_draws(recipe, tokenizer, rows).items()}


def preview_draws(recipe: Any, tokenizer: Any, rows: int = 64) -> dict[str, DistanceDraws]:
    """Each task source's distance draws (distances and needle positions per sample) from its first ``rows`` rows.

    Built as :func:`preview_task_distances` builds them, on a noise haystack.
    """
    from ctxext.tasks import Haystack

    out = {}
    for i, source in enumerate(recipe.data.mixture or []):
        if source.task and source.weight > 0:
            key = f"data.mixture[{i}]"
            haystack = Haystack.noise(tokenizer, 4 * recipe.seq_len)
            _, out[key] = _task_rows(
                key, source, tokenizer, haystack, rows, recipe, recipe.rope.target_length, Counter()
            )
    return out


def held_out_texts(recipe: Any, tokenizer: Any) -> list[str]:
    """The raw text of the documents a recipe's run holds out for validation (never trained on).

    The same split :func:`prepare_training_data` makes: the first corpus source's (or ``data.path``'s)
    document-level validation split, with the recipe's seed and ``max_documents``.

    Raises:
        InputError: the recipe has no corpus source, holds nothing out (``data.validation_fraction`` 0), or
            its data cannot be read.
    """
    data = recipe.data
    corpus = [(k, s) for k, s in _keyed_sources(data) if s.path]
    if not corpus or data.validation_fraction == 0:
        raise InputError(
            "data: this run's recipe holds no documents out for validation (no corpus source, or "
            "data.validation_fraction 0); name held-out text to measure on instead (--data)"
        )
    corpora, _ = _prepare_corpora(data, corpus[:1], tokenizer, recipe.seq_len, recipe.train.seed)
    held = corpora[corpus[0][0]].validation_documents
    return list(held["text"]) if held is not None else []


def _keyed_sources(data: Any) -> list[tuple[str, Any]]:
    """The recipe's sources with the key messages name them by: ``data.mixture[i]``, or ``data`` for ``data.path``."""
    if data.mixture:
        return [(f"data.mixture[{i}]", s) for i, s in enumerate(data.mixture)]
    return [("data", _whole_path_source(data))]


def _whole_path_source(data: Any) -> Any:
    from ctxext.recipe.sections import MixtureSource

    return MixtureSource(path=data.path, weight=1.0, text_field=data.text_field)


def _length_dependent(plan: Any) -> bool:
    from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES

    return getattr(plan, "rope_parameters", {}).get("rope_type") in LENGTH_DEPENDENT_TYPES


def _official_pose(recipe: Any, plan: Any) -> PoseRows | None:
    """How corpus rows are cut when the recipe trains with the official PoSE sampling, else ``None``."""
    pose = recipe.train.pose
    if pose is None or pose.sampling != "official":
        return None
    target = plan.target_length if plan is not None else recipe.rope.target_length
    return PoseRows(target_length=target, seed=recipe.train.seed)


def _prepare_corpora(
    data: Any, corpus: list[tuple[str, Any]], tokenizer: Any, seq_len: int, seed: int, pose: PoseRows | None = None
) -> tuple[dict[str, TrainingData], frozenset[str]]:
    """Each corpus source's blocks, and the digests of the validation documents (the first corpus's).

    The later corpora leave the validation documents out, so a corpus read twice (or two corpora that
    share files) never trains on what the validation loss measures.
    """
    corpora: dict[str, TrainingData] = {}
    held_out: frozenset[str] = frozenset()
    for key, source in corpus:
        try:
            corpora[key] = prepare_data(
                _corpus_section(data, source), tokenizer, seq_len, seed, source.path, exclude=held_out, pose=pose
            )
        except InputError as exc:
            raise InputError(f"{key}.path: {exc}") from None
        if key == corpus[0][0] and corpora[key].validation_documents is not None:
            held_out = frozenset(text_digest(t) for t in corpora[key].validation_documents["text"])
    return corpora, held_out


def _haystack(
    data: Any,
    path: str,
    corpus: list[tuple[str, Any]],
    corpora: dict[str, TrainingData],
    held_out: frozenset[str],
    tokenizer: Any,
    tokens: int,
) -> Any:
    """A task's haystack: training documents only, within ``max_documents``.

    From a corpus source of the mixture: its training documents. From another path: its first
    ``data.max_documents`` documents, less the validation documents.
    """
    from ctxext.tasks import Haystack

    key = next((k for k, s in corpus if s.path == path), None)
    if key is not None:
        docs = corpora[key].train_documents
    else:
        section = data.model_copy(update={"path": path, "text_field": "text", "mixture": None, "short_fraction": 0.0})
        docs = select_documents(section, held_out)
    # The rows never use more filler than their own tokens: a bigger haystack only costs tokenizing.
    need = max(1, min(HAYSTACK_MIN_TOKENS, tokens))
    return Haystack.from_texts(tokenizer, (row["text"] for row in docs), need, path)
