"""``ctxext search``: operators keep factors monotone, seeds reproduce the named methods, runs reproduce and resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import CtxextError, InputError
from ctxext.recipe.budget import parse_budget
from ctxext.rope.runtime import patch_model, rotary_modules, verify_model_rope
from ctxext.rope.scaling_types import reference_rope
from ctxext.search.evolution import Evolution, EvolutionSettings
from ctxext.search.factors import base_inv_freq, is_monotone, method_factors, seeds
from ctxext.search.run import SearchSettings, run_search
from tests.helpers.tiny import tiny_config, tiny_model

runner = CliRunner()
TARGET = 512  # the tiny model's context is 256: 2×


def _settings(model_dir, out, **kw) -> SearchSettings:
    base = dict(
        model=str(model_dir),
        target_length=TARGET,
        out=out,
        population=4,
        generations=2,
        samples=4,
        budget="10m",
        report=False,
        show_progress=False,
        # The random tiny model retrieves no needle form inside its window; these tests exercise the search
        # machinery, so every form is admitted (test_search_forms.py tests the check itself).
        min_form_accuracy=0.0,
        # The mean-over-depths objective with a fixed attention factor: test_search_attention.py tests the
        # recommended defaults (worst depth, attention factor searched).
        objective="needle",
        attention_factor=1.0,
    )
    base.update(kw)
    return SearchSettings(**base)


# --------------------------------------------------------------------------------------------------
# operators and seeds (no model)
# --------------------------------------------------------------------------------------------------


def test_mutation_and_crossover_keep_factors_monotone_and_in_bounds():
    evo = Evolution(EvolutionSettings(seed=3, mutation_rate=0.5), lower=1.0, upper=9.0)
    rng = np.random.default_rng(0)
    parents = [np.sort(rng.uniform(1.0, 9.0, 32)) for _ in range(8)]
    made = 0
    for i in range(300):
        a, b = parents[i % 8], parents[(i * 5 + 1) % 8]
        for child in (evo.mutate(a), evo.crossover(a, b)):
            if child is None:
                continue
            made += 1
            assert is_monotone(child)
            assert child.min() >= 1.0 and child.max() <= 9.0
    assert made > 300
    # A mutant differs from its parent, and crossover children mix both parents.
    assert not np.array_equal(evo.mutate(parents[0]), parents[0])


def test_seeds_reproduce_the_named_methods_frequencies():
    config = tiny_config()
    d, theta, L = 16, 10000.0, 256
    s = TARGET / L
    base = theta ** (-np.arange(d // 2) * 2.0 / d)
    # Independent formulas (not ctxext's): PI divides every frequency by s; NTK raises the base.
    assert np.allclose(method_factors(config, "linear", TARGET), s, rtol=0, atol=1e-12)
    ntk = base / ((theta * s ** (d / (d - 2))) ** (-np.arange(d // 2) * 2.0 / d))
    assert np.allclose(method_factors(config, "ntk", TARGET), ntk, rtol=1e-12)
    # Every method (and grid point): base / factors equals what transformers computes after patching.
    for method, options in [("yarn", {}), ("yarn", {"beta_fast": 8.0, "beta_slow": 2.0}), ("llama3", {}), ("ntk", {})]:
        model = tiny_model()
        patch_model(model, method, TARGET, options)
        (_, module), *_ = rotary_modules(model)
        factors = method_factors(config, method, TARGET, options)
        runtime = module.inv_freq.double().numpy()
        assert np.allclose(base / factors, runtime, rtol=1e-6), method
    grid = seeds(config, TARGET)
    assert [g.name for g in grid[:4]] == ["linear", "ntk", "yarn", "llama3"]
    assert all(is_monotone(g.factors) for g in grid)
    assert len({tuple(g.factors) for g in grid}) == len(grid)


def test_attention_factor_setting():
    from ctxext.search.apply import resolve_attention_factor

    assert resolve_attention_factor("auto", 4.0, 64) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    assert resolve_attention_factor("1", 4.0, 64) == 1.0 and resolve_attention_factor(1.2, 4.0, 64) == 1.2
    for bad in ("big", 0, -1.0):
        with pytest.raises(InputError):
            resolve_attention_factor(bad, 4.0, 64)


def test_parse_budget():
    assert parse_budget("90s") == 90 and parse_budget("10m") == 600 and parse_budget("1h") == 3600
    assert parse_budget("1.5h") == 5400 and parse_budget(" 45 ") == 45
    for bad in ("0", "-5m", "soon", "0s"):
        with pytest.raises(InputError):
            parse_budget(bad)


# --------------------------------------------------------------------------------------------------
# whole searches on the tiny model
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def first_search(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("search") / "a"
    return run_search(_settings(tiny_model_dir, out), log=lambda _: None)


def test_same_seed_same_result(first_search, tiny_model_dir, tmp_path):
    again = run_search(_settings(tiny_model_dir, tmp_path / "b"), log=lambda _: None)
    assert again.long_factor == first_search.long_factor
    assert again.score == first_search.score
    other = run_search(_settings(tiny_model_dir, tmp_path / "c", seed=1), log=lambda _: None)
    log = [json.loads(x) for x in (tmp_path / "c" / "search.jsonl").read_text().splitlines()]
    first = [json.loads(x) for x in (first_search.out / "search.jsonl").read_text().splitlines()]
    # Another seed draws other mutants (seeds, evaluated first, are the same).
    assert [r["factors"] for r in log if r["type"] == "candidate"] != [
        r["factors"] for r in first if r["type"] == "candidate"
    ]
    assert other.evaluations == first_search.evaluations


def test_resume_after_interruption_gives_the_uninterrupted_result(first_search, tiny_model_dir, tmp_path):
    out = tmp_path / "r"
    seen = []

    def interrupt(cand):
        seen.append(cand.index)
        if len(seen) == 7:
            raise KeyboardInterrupt

    with pytest.raises(CtxextError, match="search interrupted; every candidate scored so far is in") as err:
        run_search(_settings(tiny_model_dir, out), log=lambda _: None, on_candidate=interrupt)
    assert err.value.exit_code == 130
    assert (out / "search.jsonl").is_file() and not (out / "config.json").exists()
    # A kill can cut the last line: the resumed search ignores it.
    with (out / "search.jsonl").open("a") as fh:
        fh.write('{"type": "candidate", "ind')
    resumed = run_search(_settings(tiny_model_dir, out, resume=True), log=lambda _: None)
    assert resumed.long_factor == first_search.long_factor
    assert resumed.evaluations == first_search.evaluations

    def scores(path):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        return [(r["index"], r["factors"], r["score"]) for r in lines if r["type"] == "candidate"]

    assert scores(out / "search.jsonl") == scores(first_search.out / "search.jsonl")


def test_a_hand_edited_score_does_not_win_on_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "forged"
    seen: list[int] = []

    def interrupt(cand):
        seen.append(cand.index)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(CtxextError, match="search interrupted"):
        run_search(_settings(tiny_model_dir, out), log=lambda _: None, on_candidate=interrupt)
    log_path = out / "search.jsonl"
    honest = log_path.read_text()
    records = [json.loads(x) for x in honest.splitlines()]
    last = max(i for i, r in enumerate(records) if r["type"] == "candidate")
    records[last]["score"] = -5.0  # an impossible NLL: it would win every comparison
    log_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ["--target-length", str(TARGET), "--out", str(out), "--resume", "--no-report", "--min-form-accuracy", "0"]
    same = ["--population", "4", "--generations", "2", "--samples", "4", "--objective", "needle"]
    r = _cli(str(tiny_model_dir), *args, *same, "--attention-factor", "1")  # _settings' search, from the CLI
    assert r.exit_code == 2, r.output
    assert "logs score -5.0 but scores" in r.output and "Traceback" not in r.output
    assert not (out / "config.json").exists()  # nothing was written from the forged log
    # A score that is not a number at all is refused by name, before anything is scored.
    records[last]["score"] = "0.1"
    log_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(InputError, match=f"candidate {records[last]['index']} has score '0.1'"):
        run_search(_settings(tiny_model_dir, out, resume=True), log=lambda _: None)
    # The honest log resumes (its best candidate scores what it logs).
    log_path.write_text(honest)
    assert run_search(_settings(tiny_model_dir, out, resume=True), log=lambda _: None).score > 0


def test_written_folder_loads_in_plain_transformers(first_search, tiny_model_dir):
    out = first_search.out
    model = AutoModelForCausalLM.from_pretrained(out).eval()  # plain transformers
    params = model.config.rope_parameters
    assert params["rope_type"] == "longrope"
    assert params["long_factor"] == first_search.long_factor
    assert params["short_factor"] == [1.0] * len(first_search.long_factor)
    assert params["original_max_position_embeddings"] == 256 and model.config.max_position_embeddings == TARGET
    assert verify_model_rope(model).ok
    inv, _ = reference_rope(params, 16, TARGET, TARGET)
    assert np.allclose(inv.numpy(), base_inv_freq_of(model) / np.array(first_search.long_factor))
    # Inside the original window the extended model computes exactly what the base computes.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    x = torch.randint(0, 500, (1, 100))
    with torch.no_grad():
        assert torch.equal(model(x).logits, base(x).logits)
    assert {"search.jsonl", "search.json", "factors.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}


def base_inv_freq_of(model) -> np.ndarray:
    from ctxext.rope.read import read_rope

    return base_inv_freq(read_rope(model.config))


@pytest.mark.slow
def test_report_compares_with_named_methods(tiny_model_dir, tmp_path):
    out = tmp_path / "rep"
    result = run_search(
        _settings(tiny_model_dir, out, generations=0, report=True, report_trials=2, report_docs=2),
        log=lambda _: None,
    )
    report = json.loads((out / "report.json").read_text())
    assert set(report["models"]) == {"base", "searched", "linear", "ntk", "yarn", "llama3"}
    cmp_ = report["comparison"]
    assert cmp_["best_named"] in ("linear", "ntk", "yarn", "llama3")
    assert math.isfinite(cmp_["objective"]["diff"]) and cmp_["objective"]["ci_low"] <= cmp_["objective"]["ci_high"]
    assert report["in_window_max_abs_nll_diff_vs_base"] == 0.0
    assert (out / "factors.png").stat().st_size > 1000 and "best named method" in (out / "report.md").read_text()
    assert report["models"]["searched"]["factors"] == result.long_factor


# --------------------------------------------------------------------------------------------------
# bad input: a clear message, exit code 2, nothing written
# --------------------------------------------------------------------------------------------------


def _cli(*args: str):
    return runner.invoke(app, ["search", *args], catch_exceptions=False)


def test_bad_input_is_a_clear_error_and_writes_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    common = ["--out", str(out), "--population", "4", "--generations", "1", "--no-report"]
    r = _cli(str(tiny_model_dir), "--target-length", "256", *common)
    assert r.exit_code == 2 and "not above the model's current context" in r.output
    r = _cli(str(tiny_model_dir), "--target-length", "512", "--budget", "0", *common)
    assert r.exit_code == 2 and "positive duration" in r.output
    gpt2 = tmp_path / "gpt2"
    GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64).save_pretrained(gpt2)
    r = _cli(str(gpt2), "--target-length", "512", *common)
    assert r.exit_code == 2 and "no rotary position embedding" in r.output
    r = _cli(str(tiny_model_dir), "--target-length", "512", "--resume", *common)
    assert r.exit_code == 2 and "nothing to resume" in r.output
    # Fitness data that holds the report's held-out files (builtin:stdlib as evaluation data is that split).
    with_report = [a for a in common if a != "--no-report"]
    for data in ("builtin:stdlib", "builtin:stdlib-all", "builtin:stdlib-long"):
        r = _cli(str(tiny_model_dir), "--target-length", "512", "--data", data, *with_report)
        assert r.exit_code == 2 and f"--data / search.data: {data} reads" in r.output, r.output
        assert "builtin:stdlib-heldout" in r.output and "Traceback" not in r.output
    assert not out.exists()
    # --overwrite replaces only a search folder ctxext wrote: a user's folder is left alone.
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = _cli(str(tiny_model_dir), "--target-length", "512", "--overwrite", *common)
    assert r.exit_code == 2 and (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


def test_resuming_a_log_of_another_model_is_refused(first_search, tiny_model_dir, tmp_path):
    out = tmp_path / "other"
    out.mkdir()
    header = json.loads((first_search.out / "search.jsonl").read_text().splitlines()[0])
    header["fingerprint"] = "0123456789abcdef"  # written for other weights
    header["settings"]["target_length"] = 1024
    (out / "search.jsonl").write_text(json.dumps(header) + "\n")
    from ctxext.atomic import write_manifest

    write_manifest(out, "search")
    before = (out / "search.jsonl").read_bytes()
    args = ["--target-length", str(TARGET), "--out", str(out), "--resume", "--no-report"]
    r = _cli(str(tiny_model_dir), *args, "--population", "4", "--generations", "2", "--samples", "4")
    assert r.exit_code == 2
    assert "cannot resume" in r.output and "fingerprint" in r.output and "target_length" in r.output
    assert (out / "search.jsonl").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [".ctxext-output.json", "search.jsonl"]


def test_recipe_search_section(tmp_path, first_search, tiny_model_dir):
    from ctxext.recipe.schema import RecipeError, parse_recipe
    from ctxext.search.recipe import search_before_training, settings_from_recipe

    data = {
        "model": {"path": str(tiny_model_dir)},
        "rope": {"method": "longrope", "target_length": TARGET},
        "data": {"path": "builtin:stdlib"},
        "output": {"dir": str(tmp_path / "run")},
        "search": {"budget": "2m", "population": 8, "generations": 3, "out": str(first_search.out)},
    }
    recipe = parse_recipe(data)
    settings = settings_from_recipe(recipe)
    assert (settings.budget, settings.population, settings.target_length) == ("2m", 8, TARGET)
    # Keys the section leaves out take the declared defaults; flags given to `ctxext search --recipe` win.
    assert (settings.objective, settings.samples) == ("needle-worst", 128)
    assert settings_from_recipe(recipe, given={"samples": 16}).samples == 16
    # A completed search folder is reused: its factors go into rope, nothing is searched again.
    searched = search_before_training(recipe, log=lambda _: None)
    assert searched.recipe.rope.long_factor == first_search.long_factor and searched.recipe.rope.attention_factor == 1.0
    # The recipe trained is the resolved one (factors, no search section); run.json gets the search's record.
    assert searched.recipe.search is None and recipe.search is not None
    assert searched.record["score"] == first_search.score and searched.record["folder"] == str(first_search.out)
    with pytest.raises(RecipeError) as err:
        parse_recipe({**data, "rope": {"method": "yarn", "target_length": TARGET}})
    assert "rope.method" in str(err.value)
    with pytest.raises(RecipeError) as err:
        parse_recipe({**data, "search": {"budget": "0"}})
    assert "search.budget" in str(err.value)


def test_far_ppl_objective_is_the_nll_beyond_the_window(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from ctxext.scoring.nll import token_nll
    from ctxext.search.objective import far_ppl_set

    out = tmp_path / "far"
    settings = _settings(tiny_model_dir, out, objective="far-ppl", samples=2, generations=1)
    result = run_search(settings, log=lambda _: None)
    lines = [json.loads(x) for x in (out / "search.jsonl").read_text().splitlines()]
    assert lines[0]["objective_set"]["scored_from"] == 256 and lines[0]["objective_set"]["documents"] == 2
    linear = next(r for r in lines if r["type"] == "candidate" and r["origin"] == "seed:linear")
    # The logged score of the PI seed is the mean NLL of positions ≥ 256, recomputed here independently.
    docs = far_ppl_set(AutoTokenizer.from_pretrained(tiny_model_dir), "builtin:stdlib-train", TARGET, 256, 2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    patch_model(model, "linear", TARGET)
    nll = token_nll(model, torch.tensor(docs.sequences), score_from=256)
    assert linear["score"] == pytest.approx(float(nll.double().mean()), rel=1e-5)
    assert result.score <= linear["score"]
