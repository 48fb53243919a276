"""One checkpointed training step's live peak against the plan, in a process of its own.

``python tests/helpers/live_peak_worker.py MODEL_DIR [KEY=VALUE ...]``: builds ``recipes/tiny-cpu.yaml``'s model (nf4 +
LoRA, chunked loss) from ``MODEL_DIR`` at 1,024 tokens with the given overrides, runs one step so that the LoRA
gradients exist (as in training), then profiles a second step and prints ``[measured, planned]`` in bytes: the
largest live tensor memory in the CPU profiler's allocation timeline, and the plan's activations + loss at its
largest phase. Used by ``tests/unit/planner/test_plan_band.py``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch

from ctxext.models.devices import cpu_device
from ctxext.planner.footprint import PHASES
from ctxext.planner.plan import plan_recipe
from ctxext.recipe.schema import load_recipe
from ctxext.training.model import build_training_model
from ctxext.training.steps import CausalLMWithChunkedLoss

LENGTH = 1024


def live_peak(step: Callable[[], None]) -> int:
    """The largest live tensor memory during ``step``, from the CPU memory profiler's allocation timeline."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    live = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        live += size if action.name == "CREATE" else -size if action.name == "DESTROY" else 0
        peak = max(peak, live)
    return peak


def main(model_dir: str, overrides: list[str]) -> tuple[int, int]:
    """Measure and plan one step; see the module docstring."""
    torch.set_num_threads(1)
    recipe = load_recipe(
        "recipes/tiny-cpu.yaml",
        [f"model.path={model_dir}", f"train.seq_len={LENGTH}", "train.micro_batch_size=1", *overrides],
    )
    loaded = build_training_model(recipe)
    model = CausalLMWithChunkedLoss(loaded.model, recipe.train.loss_chunk_size).train()
    ids = torch.randint(3, 500, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)

    def step() -> None:
        total, count = model(ids, labels)
        (total / count).backward()

    step()  # the LoRA gradients exist from here on, as in training
    measured = live_peak(step)
    plan = plan_recipe(recipe, cpu_device(), config=loaded.model.get_base_model().config, search=False)
    planned = max(plan.memory.group_total("activations", p) + plan.memory.group_total("loss", p) for p in PHASES)
    return measured, int(planned)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
