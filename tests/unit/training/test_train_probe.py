"""Adaptive stop (``train.probe``): stops at the goal, on a plateau or at the ceiling (saying so), keeps the best
probe's adapter, survives a kill and resume, and stops at the same step on every process of a job."""

from __future__ import annotations

import json

import pytest
import torch

import ctxext.training.loop as loop_module
import ctxext.training.run as train_module
from ctxext.artifacts.run import read_run
from ctxext.errors import CtxextError
from ctxext.models.builtin import GROWN_DIR
from ctxext.recipe.schema import load_recipe
from ctxext.training.probe import ProbeState, decide, score_of
from ctxext.training.run import train
from tests.helpers.train import ROOT, accelerate_cmd, adapter_tensors, head_shape_model, run, write_recipe


def _recipe(tmp_path, name, probe, **train):
    train = {"max_steps": 4, "micro_batch_size": 1, **train, "probe": {"trials": 8, "keys": 4, **probe}}
    return load_recipe(write_recipe(tmp_path / f"{name}.yaml", tmp_path / name, train=train))


def _readings(run_dir):
    return [(r["step"], r["correct"], r["n"]) for r in json.loads((run_dir / "probe.json").read_text())["readings"]]


def test_decide_goal_plateau_and_best():
    state = ProbeState()
    assert decide(state, {"rate": 0.5}, goal=0.9, patience=2) == (None, True)
    state.best_rate, state.since_best = 0.5, 1
    assert decide(state, {"rate": 0.4}, goal=0.9, patience=2) == ("plateau", False)
    assert decide(state, {"rate": 0.4}, goal=0.9, patience=None) == (None, False)
    assert decide(state, {"rate": 0.6}, goal=0.9, patience=2) == (None, True)
    assert decide(state, {"rate": 0.95}, goal=0.9, patience=2) == ("goal", True)


def test_the_worst_depth_decides():
    # 95 % of all keys, but one depth at 80 %: not the goal (the target is every depth's), and not better than a
    # reading whose worst depth is 90 %.
    state = ProbeState()
    lopsided = {"rate": 0.95, "score": 0.80}
    assert decide(state, lopsided, goal=0.9, patience=2) == (None, True)
    state.best_rate, state.since_best = score_of({"rate": 0.9, "score": 0.9}), 0
    assert decide(state, lopsided, goal=0.9, patience=1) == ("plateau", False)
    assert decide(state, {"rate": 0.96, "score": 0.92}, goal=0.9, patience=1) == ("goal", True)
    # An equal worst depth with more keys retrieved overall is better (the best reading is in the curve).
    state = ProbeState(readings=[{"step": 80, "rate": 0.96, "score": 0.9375}], best_rate=0.9375, best_step=80)
    assert decide(state, {"step": 160, "rate": 0.98, "score": 0.9375}, goal=0.95, patience=4) == (None, True)
    assert decide(state, {"step": 160, "rate": 0.95, "score": 0.9375}, goal=0.95, patience=4) == (None, False)


def test_a_run_that_has_learned_stops_at_the_first_probe(tmp_path, capsys):
    # Goal 0: whatever the first probe reads meets it.
    result = train_module.train(_recipe(tmp_path, "early", {"interval": 1, "goal": 0.0}))
    out = capsys.readouterr().out
    info = read_run(tmp_path / "early")
    assert info.steps == 1 and info.probe is not None
    assert info.probe.stopped == "goal" and info.probe.stop_step == 1 and info.probe.best_step == 1
    assert info.probe.fraction is not None and 0 < info.probe.fraction < 1
    assert "probe: goal 0% at every depth reached at step 1 of at most 4" in out
    assert "probe" in out.splitlines()[-1] and "of the run time" in out.splitlines()[-1], out
    curve = json.loads((tmp_path / "early" / "probe.json").read_text())
    assert [r["step"] for r in curve["readings"]] == [1] and curve["readings"][0]["n"] == 8
    assert {"rate", "low", "high", "nll", "seconds"} <= set(curve["readings"][0])
    # The keys by form add up to the probe's (its forms are the mixture's needle templates).
    by_form = curve["readings"][0]["by_form"]
    assert len(by_form) > 1 and sum(n for _, n in by_form.values()) == 8
    assert sum(c for c, _ in by_form.values()) == curve["readings"][0]["correct"]
    assert "by key form " in out
    # By depth: the evaluation's five depths, as many keys at each as 8 allow; the worst one is the score.
    by_depth = curve["readings"][0]["by_depth"]
    assert list(by_depth) == ["0", "25", "50", "75", "100"] and [n for _, n in by_depth.values()] == [2, 2, 2, 1, 1]
    assert curve["readings"][0]["score"] == min(c / n for c, n in by_depth.values())
    assert curve["depths"] == [0.0, 0.25, 0.5, 0.75, 1.0] and "; by depth 0 %: " in out
    assert (
        "probe: 8 keys at 512 tokens at 5 depths from 0 to 100 % every 1 steps on " in out and "at every depth" in out
    )
    assert info.probe.filler_tokens > 0 and f"on {info.probe.filler_tokens:,} tokens of held-out validation" in out
    # The tiny model retrieves no key form inside its window: the probe asks in every training form, and says so.
    assert "the probe asks in form(s) 0, 1, 2, 3 (none is retrieved there" in out, out
    assert info.probe.window_forms is not None and not any(c["kept"] for c in info.probe.window_forms)
    assert (tmp_path / "early" / "probe.png").stat().st_size > 0
    assert result.model is not None


def test_a_run_that_cannot_stops_at_the_ceiling_with_the_best_adapter(tmp_path, capsys):
    # An untrained tiny model retrieves nothing: goal 1.0 is never met, no plateau stop (patience null).
    recipe = _recipe(tmp_path, "ceiling", {"interval": 1, "goal": 1.0, "patience": None}, max_steps=3, save_every=1)
    recipe.train.keep_checkpoints = 5
    result = train_module.train(recipe)
    out = capsys.readouterr().out
    info = read_run(tmp_path / "ceiling")
    assert info.steps == 3 and info.probe is not None and info.probe.stopped == "ceiling"
    assert "probe: goal 100% at every depth NOT reached by train.max_steps (3)" in out, out
    assert "(goal 100% at every depth, no stop on a plateau, at most 3 steps)" in out
    assert [s for s, _, _ in _readings(tmp_path / "ceiling")] == [1, 2, 3]
    # Every probe reads the same (0 %): the first is the best, and the adapter written is step 1's, not step 3's.
    best = info.probe.best_step
    assert best == 1 and "the adapter is that step's" in out
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    ckpt = load_file(str(tmp_path / "ceiling" / "checkpoints" / f"step-{best:07d}" / "model.safetensors"))
    later = load_file(str(tmp_path / "ceiling" / "checkpoints" / "step-0000002" / "model.safetensors"))
    params = dict(result.model.named_parameters())
    trained = [n for n, p in params.items() if p.requires_grad]
    assert trained
    assert all(torch.equal(params[n].detach(), ckpt["peft_model." + n]) for n in trained)
    assert any(not torch.equal(params[n].detach(), later["peft_model." + n]) for n in trained)
    written = adapter_tensors(tmp_path / "ceiling")
    expected = get_peft_model_state_dict(result.model)
    assert set(written) == set(expected)
    assert all(torch.equal(written[k], expected[k].cpu()) for k in written)
    # Step 1 trained at learning rate 0 (one warmup step): the best probe's LoRA B matrices are still zero.
    assert all(not written[k].any() for k in written if "lora_B" in k)


def test_a_killed_run_resumes_and_stops_at_the_same_step(tmp_path, monkeypatch):
    # Every probe reads 0 %: with patience 2 the run stops on a plateau at step 6 (probes at 2, 4, 6), before
    # max_steps 8. The resumed run can stop there only if the probes before the kill came back with the checkpoint.
    probe = {"interval": 2, "goal": 1.0, "patience": 2}
    straight = train_module.train(_recipe(tmp_path, "straight", probe, max_steps=8))
    assert read_run(tmp_path / "straight").probe.stop_step == 6  # type: ignore[union-attr]

    recipe = _recipe(tmp_path, "killed", probe, max_steps=8, save_every=1)
    calls = {"n": 0}
    real = loop_module.build_inputs

    def interrupt_at_step_5(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "build_inputs", interrupt_at_step_5)
    with pytest.raises(CtxextError):
        train_module.train(recipe)
    monkeypatch.setattr(loop_module, "build_inputs", real)
    assert read_run(tmp_path / "killed", allow_incomplete=True).steps == 4
    # The curve written while the run went on says it has not stopped (not "ceiling" at the last probe's step).
    curve = json.loads((tmp_path / "killed" / "probe.json").read_text())
    assert curve["stopped"] is None and curve["stop_step"] is None
    assert [r["step"] for r in curve["readings"]] == [2, 4]
    resumed = train_module.train(recipe, resume=True)
    a, b = read_run(tmp_path / "straight"), read_run(tmp_path / "killed")
    assert b.steps == a.steps == 6 and b.probe is not None and b.probe.stopped == "plateau"
    assert _readings(tmp_path / "killed") == _readings(tmp_path / "straight")
    assert b.probe.best_step == a.probe.best_step  # type: ignore[union-attr]
    for (name, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True], ids=["ddp", "sequence-split"])
def test_every_process_stops_at_the_same_step(tmp_path, cache_root, split):
    # 2 processes, data-parallel or one row split over both (ctxext's Ulysses on a 3-head / 1-kv-head model):
    # the probe stops the run on a plateau at step 4 of 6, on both processes.
    sections: dict = {
        "data": {"max_documents": 20, "validation_fraction": 0.2},
        "train": {"max_steps": 6, "micro_batch_size": 1, "eval_batches": 1,
                  "probe": {"trials": 8, "keys": 4, "interval": 2, "goal": 1.0, "patience": 1}},
    }  # fmt: skip
    extra = []
    if split:
        sections["model"] = {"path": str(head_shape_model(tmp_path / "model", heads=3, kv_heads=1, head_dim=16))}
        extra = ["train.sequence_parallel_size=2"]
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **sections)
    done = run(
        accelerate_cmd(2, "train", str(recipe), *extra),
        timeout=400,
        ACCELERATE_USE_CPU="true",
        CTXEXT_CACHE=str(cache_root),
        CTXEXT_RANK_AUDIT=str(tmp_path / "ranks"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    info = read_run(tmp_path / "run")
    assert info.steps == 4 and info.probe is not None and info.probe.stopped == "plateau"
    assert [s for s, _, _ in _readings(tmp_path / "run")] == [2, 4]
    assert all(n == 8 for _, _, n in _readings(tmp_path / "run"))  # the two processes' shares add up
    for reading in json.loads((tmp_path / "run" / "probe.json").read_text())["readings"]:
        assert sum(n for _, n in reading["by_form"].values()) == 8  # and so do their counts by form
    ranks = [json.loads((tmp_path / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]["blocks"]) == len(ranks[1]["blocks"]) == 4  # 4 steps x 1 row on each
    assert ranks[0]["trainable_sha256"] == ranks[1]["trainable_sha256"]
    if split:
        # Each process scored whole key sets with the split's attention off: the same answer NLL as one process.
        train(load_recipe(write_recipe(tmp_path / "one.yaml", tmp_path / "one", **sections)))
        one = json.loads((tmp_path / "one" / "probe.json").read_text())["readings"]
        two = json.loads((tmp_path / "run" / "probe.json").read_text())["readings"]
        assert [r["step"] for r in one] == [2, 4]
        for a, b in zip(one, two, strict=True):
            assert abs(a["nll"] - b["nll"]) <= 1e-4 * a["nll"], (one, two)


def test_a_probe_too_short_for_its_keys_is_refused_before_the_run_folder(tmp_path):
    from ctxext.errors import InputError

    recipe = _recipe(tmp_path, "short", {"length": 64, "keys": 8, "interval": 1})
    with pytest.raises(InputError, match=r"train\.probe: a key set of 8 needles needs at least \d+ tokens"):
        train_module.train(recipe)
    assert not (tmp_path / "short" / "run.json").exists()


def test_one_key_per_input_probes_every_depth(tmp_path):
    # The default probe is one key per input (a multi-key input is a lookup among distractors, which a base that
    # retrieves a single needle may not do); its inputs together must cover 0–100 %, not one depth.
    from transformers import AutoTokenizer

    from ctxext.models.sources import resolve_model_path
    from ctxext.training.probe_inputs import build_probe_inputs

    recipe = _recipe(tmp_path, "depths", {"keys": 1, "interval": 1})
    from ctxext.recipe.sections import ProbeSection

    assert ProbeSection().keys == 1
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(recipe.model.path)))
    docs = {"text": ["def f(x):\n    return x + 1\n" * 40] * 4}
    inputs = build_probe_inputs(recipe, tokenizer, docs)
    forms = recipe.probe_forms()
    assert inputs.forms == [forms[j % len(forms)] for j in range(8)]  # the forms take turns over the inputs
    depths = sorted(d for ds in inputs.depths for d in ds)
    assert inputs.trials == 8 and len(inputs.sequences) == 8
    # By default at the evaluation's five depths in turn, both ends included (100 %: right before the question).
    assert ProbeSection().depths == 5
    assert depths == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 1.0]
    # depths: null spreads them over the inputs instead.
    recipe.train.probe.depths = None
    spread = sorted(d for ds in build_probe_inputs(recipe, tokenizer, docs).depths for d in ds)
    assert spread == pytest.approx([(j + 0.5) / 8 for j in range(8)])


needs_grown = pytest.mark.skipif(
    not (GROWN_DIR / "model.safetensors").is_file(), reason="the grown model is not packaged"
)


@needs_grown
def test_the_probe_asks_in_the_forms_the_base_retrieves_in_its_window_and_keeps_the_extension():
    # The grown base retrieves form 0 (KEY_xy = …) in its 64-token window and never forms 1-2: the default recipe's
    # probe asks in form 0 only. The check runs the base's own RoPE and hands the model back extended.
    from itertools import islice
    from types import SimpleNamespace

    from accelerate.utils import DistributedType
    from datasets import Dataset

    from ctxext.rope.runtime import rotary_modules
    from ctxext.scoring.texts import iter_texts
    from ctxext.training.model import build_training_model
    from ctxext.training.probe_inputs import probe_inputs_for

    overrides = ["model.path=builtin:grown-code-64", "quantization.mode=none"]
    recipe = load_recipe(ROOT / "recipes" / "default.yaml", overrides)
    loaded = build_training_model(recipe, "cpu")
    before = [m.inv_freq.clone() for _, m in rotary_modules(loaded.model)]
    documents = Dataset.from_dict({"text": list(islice(iter_texts("builtin:stdlib"), 40))})
    single = SimpleNamespace(distributed_type=DistributedType.NO, num_processes=1)
    inputs = probe_inputs_for(recipe, loaded, documents, single)
    checks = {c["template"]: c for c in inputs.window_forms or []}
    assert checks[0]["kept"] and not checks[1]["kept"] and not checks[2]["kept"], checks
    assert set(inputs.forms) == {0} and inputs.trials == recipe.train.probe.trials
    assert inputs.window == 64 and inputs.length == 256
    line = inputs.forms_line() or ""
    assert "inside its 64-token window: form 0: 100 %" in line and "asks in form(s) 0" in line, line
    after = [m.inv_freq for _, m in rotary_modules(loaded.model)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert loaded.model.config.rope_parameters["rope_type"] == "llama3"
    # With train.probe.forms: trained, every training form.
    recipe.train.probe.forms = "trained"
    assert set(probe_inputs_for(recipe, loaded, documents, single).forms) == {0, 1, 2}


def test_the_probe_draws_its_filler_from_the_whole_validation_split():
    # Four probe lengths of text (what it read before) were two files of a 20-file split: keys right before the
    # question read 32/32 there and 80/100 over the whole split. Now every document up to 200k tokens.
    from transformers import AutoTokenizer

    from ctxext.models.sources import resolve_model_path
    from ctxext.training.probe_inputs import HAYSTACK_TOKENS, _validation_haystack

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path("builtin:grown-code-64")))
    docs = {"text": [f"def f{i}(x):\n    return x + {i}\n" * 20 for i in range(20)]}
    from ctxext.tasks.base import encode

    total = sum(len(encode(tokenizer, text + "\n\n")) for text in docs["text"])
    haystack = _validation_haystack(tokenizer, docs, 64)
    assert len(haystack.ids) == total and total > 4 * (4 * 64) and HAYSTACK_TOKENS >= 200_000


def test_the_pooled_rule_takes_all_keys_with_a_floor_under_each_depth():
    # 95 % of all keys with one depth at 91 %: the goal under `pooled` (floor 90 %), not under `worst`.
    near = {"step": 160, "rate": 0.95, "score": 0.91, "by_depth": {"0": [31, 32], "50": [29, 32], "100": [31, 32]}}
    assert decide(ProbeState(), near, goal=0.95, patience=None)[0] is None
    assert decide(ProbeState(), near, goal=0.95, patience=None, rule="pooled", margin=0.05) == ("goal", True)
    # One depth below the floor is not the goal, however many keys the others retrieve.
    low = {"step": 80, "rate": 0.97, "score": 0.875, "by_depth": {"0": [32, 32], "50": [28, 32], "100": [32, 32]}}
    assert decide(ProbeState(), low, goal=0.95, patience=None, rule="pooled", margin=0.05) == (None, True)
    # The reading that meets it is the adapter kept, though an earlier one retrieved more keys in all.
    state = ProbeState(readings=[low], best_rate=0.97, best_step=80)
    assert decide(state, near, goal=0.95, patience=None, rule="pooled", margin=0.05) == ("goal", True)
    # Without the goal, better under `pooled` is more keys in all.
    assert decide(state, {**near, "rate": 0.93}, goal=0.95, patience=None, rule="pooled")[1] is False


def test_a_run_stops_under_the_pooled_rule_and_records_it(tmp_path, capsys):
    train_module.train(_recipe(tmp_path, "pooled", {"interval": 1, "goal": 0.0, "rule": "pooled", "margin": 0.0}))
    info = read_run(tmp_path / "pooled")
    assert info.steps == 1 and info.probe is not None and info.probe.stopped == "goal"
    assert (info.probe.rule, info.probe.margin) == ("pooled", 0.0)
    assert "goal 0% over all keys, no depth below 0% reached at step 1" in capsys.readouterr().out
