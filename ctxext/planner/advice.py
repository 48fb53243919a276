"""Advice for a recipe that does not fit: single changes, their combination, a sequence split — each re-planned."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ctxext.models.devices import Device
from ctxext.planner.fit import device_footprint, fits, longest_fit, upper, usable
from ctxext.planner.footprint import ModelShape, Setup
from ctxext.planner.layer import kv_heads_per_rank, replicated_kv, replication_bytes
from ctxext.planner.levers import lever_advice


@dataclass
class Advice:
    """One change that makes the recipe fit, re-planned.

    Attributes:
        summary: what to change, in words.
        overrides: recipe ``key=value`` overrides it takes.
        launch: launch changes (GPUs, sharding), in words, or ``""``.
        total: the re-planned peak per GPU, bytes.
        fits: whether the re-planned recipe fits.
        longest: the longest fitting seq_len with the change.
    """

    summary: str
    overrides: list[str]
    launch: str
    total: int
    fits: bool
    longest: int | None


def _advice_candidates(setup: Setup, device: Device, gpus: int) -> list[tuple[str, list[str], str, Setup]]:
    """Single changes to try, cheapest first: (summary, overrides, launch change, new setup)."""
    out: list[tuple[str, list[str], str, Setup]] = []
    rep = dataclasses.replace
    if not setup.checkpointing:
        out.append(
            (
                "turn on gradient checkpointing",
                ["train.gradient_checkpointing=true"],
                "",
                rep(setup, checkpointing=True),
            )
        )
    if setup.micro_batch > 1:
        accumulation = setup.accumulation * setup.micro_batch
        out.append(
            (
                "micro-batch of 1 (raise gradient accumulation to keep the batch)",
                ["train.micro_batch_size=1", f"train.gradient_accumulation_steps={accumulation}"],
                "",
                rep(setup, micro_batch=1, accumulation=accumulation),
            )
        )
    if setup.loss == "full":
        out.append(("use ctxext's chunked loss", [], "", rep(setup, loss="chunked")))
    if setup.loss == "chunked" and setup.loss_chunk > 256:
        out.append(("smaller loss chunk", ["train.loss_chunk_size=256"], "", rep(setup, loss_chunk=256)))
    out += lever_advice(setup, device)
    if setup.optimizer == "adamw" and device.kind == "cuda":
        out.append(
            ("paged 8-bit AdamW", ["train.optimizer=paged_adamw_8bit"], "", rep(setup, optimizer="paged_adamw_8bit"))
        )
    if setup.quantization != "nf4" and setup.finetune != "full":  # a full fine-tune trains unquantized weights
        out.append(("4-bit (nf4) base", ["quantization.mode=nf4"], "", rep(setup, quantization="nf4")))
    if "embed_tokens" in setup.extra_trainable:
        kept = [x for x in setup.extra_trainable if x != "embed_tokens"]
        out.append(
            (
                "do not train the embeddings in full",
                [f"lora.extra_trainable=[{','.join(kept)}]"],
                "",
                rep(setup, extra_trainable=tuple(kept)),
            )
        )
    if setup.world > 1 and setup.sharding == "none":
        out.append(
            (
                f"shard weights, gradients and optimizer over the {setup.world} GPUs (FSDP2)",
                [],
                "accelerate launch --config_file configs/accelerate/fsdp2.yaml",
                rep(setup, sharding="fsdp2"),
            )
        )
    return out


def _with_cp(setup: Setup, k: int) -> Setup:
    world = max(setup.world, k)
    world = -(-world // k) * k
    return dataclasses.replace(setup, context_parallel=k, world=world, sharding="fsdp2")


def _with_sp(setup: Setup, k: int) -> Setup:
    return dataclasses.replace(setup, sequence_parallel=k, world=-(-max(setup.world, k) // k) * k)


def _split_advice(shape: ModelShape, setup: Setup, device: Device, max_cp: int) -> list[tuple[str, str, int, Setup]]:
    """The smallest split of each kind that fits: Ulysses (under DDP; N divides the heads), context parallelism."""
    found = []
    # Splits wider than the key/value heads replicate them (each rank holds those its query heads need).
    for k in range(2 * setup.sequence_parallel, shape.heads + 1):
        if shape.heads % k == 0 and fits(shape, _with_sp(setup, k), device):
            found.append(("sequence parallelism (Ulysses)", "sequence_parallel_size", k, _with_sp(setup, k)))
            break
    if device.kind != "cuda":  # torch's ring attention runs on CUDA only
        return found
    k = 2 * setup.context_parallel
    while k <= max_cp and not fits(shape, _with_cp(setup, k), device):
        k *= 2
    if k <= max_cp:
        found.append(("context parallelism", "context_parallel_size", k, _with_cp(setup, k)))
    return found


def advise(shape: ModelShape, setup: Setup, device: Device, max_cp: int = 64) -> list[Advice]:
    """Changes that make a non-fitting setup fit, each re-planned; the combination and a sequence split last.

    Every single change is listed with its re-planned peak (whether or not it alone fits); then all the
    single-GPU changes together; then the smallest split of each sequence over GPUs that fits on top of them:
    Ulysses sequence parallelism when the heads allow it, else context parallelism.
    """
    result: list[Advice] = []
    combined = setup
    overrides_all: list[str] = []
    launch_all = ""

    def plan_one(summary: str, overrides: list[str], launch: str, new: Setup) -> Advice:
        fp = device_footprint(shape, new, device)
        longest = longest_fit(shape, new, device)
        return Advice(summary, overrides, launch, fp.total, upper(fp.total, device) <= usable(device), longest)

    base_total = device_footprint(shape, setup, device).total
    for summary, overrides, launch, new in _advice_candidates(setup, device, setup.world):
        one = plan_one(summary, overrides, launch, new)
        if one.total >= base_total * 0.99:
            continue  # does not lower the peak (e.g. a term that is not in the peak phase)
        result.append(one)
        changed = {
            f.name: getattr(new, f.name)
            for f in dataclasses.fields(new)
            if getattr(new, f.name) != getattr(setup, f.name)
        }
        combined = dataclasses.replace(combined, **changed)
        overrides_all += overrides
        launch_all = launch or launch_all
    if len(result) > 1:
        result.append(plan_one("all of the above together", overrides_all, launch_all, combined))
    if not fits(shape, combined, device):
        # A split of the recipe as it is; with the other changes only if it alone does not get there.
        for start, extra in ((setup, []), (combined, overrides_all)):
            found = _split_advice(shape, start, device, max_cp)
            # On a CPU a split is processes on this machine (gloo), not GPUs.
            units = "GPUs" if device.kind == "cuda" else "processes"
            for name, key, k, candidate in found:
                ulysses = key == "sequence_parallel_size"
                config = "multi_gpu_ddp.yaml" if ulysses else "fsdp2.yaml"
                result.append(
                    plan_one(
                        f"{name} over {k} {units} (each holds {setup.seq_len // k:,} tokens of a sequence)"
                        + (" with the changes above" if extra else ""),
                        [*extra, f"train.{key}={k}"],
                        f"{candidate.world} {units}: accelerate launch --config_file configs/accelerate/{config} "
                        f"--num_processes {candidate.world}"
                        + (" (pip install 'ctxext[deepspeed]')" if ulysses else ""),
                        candidate,
                    )
                )
            if found:
                break
    return result


def replication_notes(shape: ModelShape, setup: Setup, device: Device) -> list[str]:
    """What replicating key/value heads under a wide Ulysses split costs, and whether it pays.

    The comparison is the widest split that needs no replication, on the same GPUs (the others then train other
    rows). Replication pays when that split does not fit the recipe's length and the wider one does; it costs
    more than it saves when the narrower split fits already (the replicas only add memory and all-to-all traffic)
    or when neither fits.
    """
    extra = replicated_kv(shape, setup)
    if extra <= 0:
        return []
    sp = setup.sequence_parallel
    held = kv_heads_per_rank(shape, sp)
    plain = max(k for k in range(1, sp + 1) if shape.heads % k == 0 and shape.kv_heads % k == 0 and sp % k == 0)
    narrow = dataclasses.replace(setup, sequence_parallel=plain)
    cost = replication_bytes(shape, setup)
    # The exchange sends the replicas too: each rank's k and v grow from kv/N heads to the held ones, on its T/N
    # tokens, of which (N - 1)/N leave; forward, recomputation and backward.
    local = setup.micro_batch * -(-setup.seq_len // sp)
    passes = 3 if setup.checkpointing else 2
    sent = shape.layers * passes * 2 * local * shape.head_dim * (held - shape.kv_heads / sp) * (sp - 1)
    sent *= setup.residual
    even = shape.heads % sp == 0  # else the ranks' query ranges differ by one head: the largest is counted
    held_text = f"{'' if even else 'up to '}{held} key/value head(s)"
    query_text = f"{shape.heads // sp} query heads" if even else f"{-(-shape.heads // sp)} or fewer query heads"
    notes = [
        f"key/value heads replicated: sp {sp} does not divide the {shape.kv_heads} key/value heads, so each rank "
        f"holds {held_text} for its {query_text} ({extra} replicas in all): "
        f"+{cost / 2**30:.2f} GiB per GPU in the recomputed layer's attention (k, v and their gradients), "
        f"+{sent / 2**30:.2f} GiB sent per GPU per micro-batch"
    ]
    wide_fits, narrow_fits = fits(shape, setup, device), fits(shape, narrow, device)
    narrow_gib = device_footprint(shape, narrow, device).total / 2**30
    wide_gib = device_footprint(shape, setup, device).total / 2**30
    if narrow_fits or not wide_fits:
        why = (
            f"sp {plain} (no replication) fits {setup.seq_len:,} tokens already ({narrow_gib:.2f} GiB per GPU)"
            if narrow_fits
            else f"sp {sp} does not fit {setup.seq_len:,} tokens either ({wide_gib:.2f} GiB per GPU)"
        )
        notes.append(
            f"replication costs more than it saves here: {why}; use train.sequence_parallel_size={plain} and "
            "the other GPUs for data parallelism"
        )
    else:
        notes.append(
            f"replication pays: sp {plain} (no replication) needs {narrow_gib:.2f} GiB per GPU for "
            f"{setup.seq_len:,} tokens and does not fit; sp {sp} needs {wide_gib:.2f} GiB"
        )
    return notes
