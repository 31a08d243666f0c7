"""Recipes as data (dcoco.train.recipe): every shipped checkpoint has one whose stages parse into
their commands' configs, and a recipe runs its stages in order, skips finished ones and ships."""

from __future__ import annotations

import json

import pytest

from dcoco.errors import DcocoError
from dcoco.models.drafter.catalogue import read_catalogue
from dcoco.paths import REPO_ROOT
from dcoco.train.drafter_train import train
from dcoco.train.recipe import flag_argv, read_recipe, run_recipe, ship
from tests.test_drafter_train import cyclic_corpus

TARGET = "smollm2-135m-instruct"
RECIPES = REPO_ROOT / "recipes" / TARGET


@pytest.mark.skipif(not RECIPES.is_dir(), reason="not a checkout")
def test_every_catalogued_checkpoint_has_a_recipe_whose_stages_parse(tmp_path):
    catalogue = read_catalogue(REPO_ROOT / "checkpoints" / TARGET)
    assert set(catalogue) <= {p.stem for p in RECIPES.glob("*.toml")}
    for name, entry in catalogue.items():
        recipe = read_recipe(RECIPES / f"{name}.toml")
        assert recipe.checkpoint == name and recipe.target == TARGET
        assert f"recipes/{TARGET}/{name}.toml" in entry["recipe"], name
        report = run_recipe(recipe, tmp_path, dry_run=True)  # parses every stage's flags
        assert all(line.startswith("to run") for line in report), report
        assert len(report) == len(recipe.stages)


def test_flags_become_the_command_line():
    flags = {"max-steps": 60, "autocast": True, "copy-gate": False, "taps": [0, 1, 3], "lr": 3e-3}
    assert flag_argv(flags) == [
        "--max-steps", "60", "--autocast", "--no-copy-gate", "--taps", "0,1,3", "--lr", "0.003",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text, message",
    [
        ("checkpoint = 'x'", "not a training recipe"),
        ("checkpoint = 'x'\ntarget = 't'\nstages = []", "distinct names"),
        (
            "checkpoint = 'x'\ntarget = 't'\n[[stages]]\nname = 'a'\ncommand = 'bench'",
            "a stage runs one of",
        ),
        (
            "checkpoint = 'x'\ntarget = 't'\n[[stages]]\nname = 'a'\ncommand = 'train-drafter'\n"
            "flags = { out = 'elsewhere' }",
            "the runner does",
        ),
        ("checkpoint = [", "not a training recipe"),
    ],
)
def test_a_bad_recipe_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(DcocoError, match=message):
        read_recipe(path)


def test_a_bad_flag_stops_the_recipe_before_any_stage_runs(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(
        "checkpoint = 'x'\ntarget = 't'\n"
        "[[stages]]\nname = 'a'\ncommand = 'train-drafter'\nflags = { max-steps = 5 }\n"
        "[[stages]]\nname = 'b'\ncommand = 'train-drafter'\nflags = { max-stepz = 5 }\n"
    )
    ran = []
    with pytest.raises(DcocoError, match="max-stepz"):
        run_recipe(read_recipe(path), tmp_path / "runs", execute=lambda c, cfg: ran.append(cfg))
    assert ran == []


TINY = (
    "block-size = 4\nmask-token-id = 3\ntaps = [0, 1, 3]\nbatch-size = 4\nanchors-per-seq = 8\n"
    "heldout = 4\neval-every = 10\nsave-every = 100\nlr = 3e-3\nautocast = false\nmax-steps = 6\n"
)


@pytest.mark.usefixtures("one_thread")
def test_a_recipe_runs_in_order_skips_finished_stages_and_ships(tiny_llama_target, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        f"checkpoint = 'tiny'\ntarget = 't'\n[common]\n{TINY}"
        "[[stages]]\nname = 'first'\ncommand = 'train-drafter'\n"
        "[[stages]]\nname = 'second'\ncommand = 'train-drafter'\ninit = 'first'\n"
        "flags = { seed = 3 }\n"
    )
    recipe, runs = read_recipe(path), tmp_path / "runs"
    ran = []

    def execute(command, config):
        ran.append(config)
        train(config, target=tiny_llama_target, samples=cyclic_corpus(), progress_bar=False)

    with pytest.raises(DcocoError, match="has not finished"):
        ship(recipe, runs, tmp_path / "checkpoints")
    run_recipe(recipe, runs, execute=execute)
    assert [c.out for c in ran] == [str(runs / "tiny" / "first"), str(runs / "tiny" / "second")]
    assert ran[1].init == str(runs / "tiny" / "first" / "drafter") and ran[1].seed == 3
    assert ran[0].block_size == 4 and ran[0].max_steps == 6
    report = run_recipe(recipe, runs, execute=execute)  # rerun: both finished, nothing trains
    assert len(ran) == 2 and all(line.startswith("done") for line in report)
    dest = ship(recipe, runs, tmp_path / "checkpoints")
    assert {p.name for p in dest.iterdir()} == {
        "config.json", "model.safetensors", "provenance.json", "train_log.jsonl",
        "first_train_log.jsonl",
    }  # fmt: skip
    assert json.loads((dest / "provenance.json").read_text())["config"]["seed"] == 3


# What a stage's training depends on (not where it runs: out, init, threads, corpus, caches).
TRAINING_FIELDS = (
    "gamma", "lr", "weight_decay", "warmup_ratio", "grad_clip", "epochs", "max_steps",
    "batch_size", "anchors_per_seq", "anchor_stride", "context_window", "window_doubling_steps",
    "max_records", "seed", "target_dtype", "autocast", "loss_vocab", "copy_hints", "copy_gate",
    "add_layers", "head", "mode", "head_loss_weight", "head_lr", "top_k", "features", "loss",
    "successor_query", "anchor", "count_pairs", "corrector_cache", "cache_parts",
)  # fmt: skip


@pytest.mark.skipif(not RECIPES.is_dir(), reason="not a checkout")
def test_each_recipe_says_what_its_shipped_checkpoint_was_trained_with(tmp_path):
    """The last stage's flags, parsed with today's defaults, equal the config the shipped
    checkpoint recorded: a changed default cannot silently change a recipe."""
    from dcoco.train.recipe import parse_stage, stage_argv

    for name in read_catalogue(REPO_ROOT / "checkpoints" / TARGET):
        recipe = read_recipe(RECIPES / f"{name}.toml")
        _, config = parse_stage(stage_argv(tmp_path, recipe, recipe.stages[-1]))
        shipped = json.loads(
            (REPO_ROOT / "checkpoints" / TARGET / name / "provenance.json").read_text()
        )
        recorded = shipped["config"]
        differ = {
            field: (getattr(config, field), recorded[field])
            for field in TRAINING_FIELDS
            if field in recorded
            and hasattr(config, field)
            and getattr(config, field) != recorded[field]
        }
        assert not differ, (name, differ)


def test_the_real_scale_recipe_plans_on_the_meta_device(capsys):
    """The Qwen3-8B-scale recipe: both models built on the meta device (no weights, no memory),
    parameters, memory per GPU, cache size and steps printed; nothing runs."""
    from dcoco.train.recipe import RecipeConfig, run

    recipe = REPO_ROOT / "recipes" / "qwen3-8b" / "dflash-b16.toml"
    assert run(RecipeConfig(recipe=str(recipe), dry_run=True, target="model-dir")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith("to run   scratch: dcoco train-drafter")
        and "--target model-dir" in lines[0]
    )
    plan = {line[:8].strip(): line[9:] for line in lines[1:]}
    assert plan["target"].startswith("8.19 B parameters")  # Qwen3-8B
    assert plan["drafter"].startswith("1048.6 M")  # 5 layers at width 4096, fc 5 x 4096 -> 4096
    memory = float(plan["memory"].split()[0])
    assert 30 < memory < 40  # bf16 target 15.3 GiB + the drafter's fp32 weights and Adam 15.6
    assert plan["cache"].startswith("40.0 KiB") and plan["steps"] == "150,000"
