"""Recipes as data: how a shipped checkpoint is trained, stage by stage, in one TOML file.

`recipes/<target>/<checkpoint>.toml`, one per catalogued checkpoint:

    checkpoint = "dflash"                 # the catalogued name it makes
    target = "smollm2-135m-instruct"
    about = "..."                         # one line: what it is
    [common]                              # flags every stage takes; a stage's own flags win
    gamma = 4
    [[stages]]                            # in order, each into <runs>/<checkpoint>/<name>/
    name = "hints"
    command = "train-drafter"             # or train-corrector
    init = "dflash-mask"                  # an earlier stage, a catalogued checkpoint or a path
    flags = { copy-hints = true, max-steps = 6000, seed = 3 }

Flags are the command's own: `max-steps = 6000` is `--max-steps 6000`, true is `--flag`, false
`--no-flag`, a list comma-separated. Every stage is validated (parsed into its command's config)
before the first one runs. A finished stage (its artefact's provenance reached its total steps)
is skipped and an interrupted one resumes from its ckpt/, so after a kill the same command
continues. `--ship` copies the last stage's artefact and every stage's log into
checkpoints/<target>/<checkpoint>/ (earlier stages' logs as <stage>_train_log.jsonl).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dcoco.config import Command, config_from_args
from dcoco.errors import DcocoError
from dcoco.paths import cache_dir, checkpoints_dir
from dcoco.train import drafter_train, head_train
from dcoco.train.corrector_cache import drafter_path

STAGE_COMMANDS = {c.name: c for c in (drafter_train.COMMAND, head_train.COMMAND)}
LOG_FILE = "train_log.jsonl"


@dataclass(frozen=True)
class Stage:
    name: str
    command: str  # a key of STAGE_COMMANDS
    init: str  # "" (a fresh drafter), an earlier stage's name, a checkpoint name or a path
    flags: dict  # flag name (as on the command line, without --) -> value


@dataclass(frozen=True)
class Recipe:
    checkpoint: str
    target: str
    about: str
    stages: tuple[Stage, ...]
    target_config: dict = field(default_factory=dict)  # the target's HF config, for --dry-run


def read_recipe(path: Path) -> Recipe:
    """The recipe in `path`; one clear error if it is not one."""
    try:
        data = tomllib.loads(Path(path).read_text())
        common = data.get("common", {})
        stages = tuple(
            Stage(s["name"], s["command"], s.get("init", ""), {**common, **s.get("flags", {})})
            for s in data["stages"]
        )
        recipe = Recipe(
            data["checkpoint"], data["target"], data.get("about", ""), stages,
            data.get("target_config", {}),
        )  # fmt: skip
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as error:
        raise DcocoError(
            f"{path} is not a training recipe ({type(error).__name__}: {error})"
        ) from None
    names = [s.name for s in recipe.stages]
    if not names or len(set(names)) != len(names):
        raise DcocoError(f"{path}: a recipe needs stages with distinct names")
    for stage in recipe.stages:
        if stage.command not in STAGE_COMMANDS:
            raise DcocoError(
                f"{path}: stage '{stage.name}' runs '{stage.command}'; a stage runs one of "
                f"{', '.join(STAGE_COMMANDS)}"
            )
        if {"out", "init"} & set(stage.flags):
            raise DcocoError(
                f"{path}: stage '{stage.name}' sets out or init as flags (the runner does)"
            )
    return recipe


def flag_argv(flags: dict) -> list[str]:
    """`{"max-steps": 6000, "autocast": True, "taps": [1, 2]}` -> the command-line flags."""
    argv = []
    for name, value in flags.items():
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")
        elif isinstance(value, list):
            argv += [f"--{name}", ",".join(str(v) for v in value)]
        else:
            argv += [f"--{name}", str(value)]
    return argv


def stage_dir(runs: Path, recipe: Recipe, stage: Stage) -> Path:
    return Path(runs) / recipe.checkpoint / stage.name


def artefact_dir(runs: Path, recipe: Recipe, stage: Stage) -> Path:
    """Where a finished stage leaves its checkpoint: <run>/drafter/ or <run>/<head kind>/."""
    name = "drafter" if stage.command == "train-drafter" else stage.flags.get("head", "dcoco")
    return stage_dir(runs, recipe, stage) / name


def stage_argv(
    runs: Path, recipe: Recipe, stage: Stage, threads: int = 0, target: str = ""
) -> list[str]:
    """The stage's full command line (after `dcoco`), with its --out and resolved --init."""
    argv = [stage.command, "--out", str(stage_dir(runs, recipe, stage))]
    if stage.init:
        argv += ["--init", str(resolve_init(runs, recipe, stage.init))]
    flags = {
        **stage.flags,
        **({"threads": threads} if threads > 0 else {}),
        **({"target": target} if target else {}),
    }
    return argv + flag_argv(flags)


def resolve_init(runs: Path, recipe: Recipe, init: str) -> Path:
    earlier = {s.name: s for s in recipe.stages}
    if init in earlier:
        return artefact_dir(runs, recipe, earlier[init])
    return drafter_path(init, SimpleNamespace(name=recipe.target))


def parse_stage(argv: list[str]):
    """(command, config) of one stage's command line; a bad flag is one clear error."""
    command: Command = STAGE_COMMANDS[argv[0]]
    parser = argparse.ArgumentParser(prog="dcoco", exit_on_error=False)
    command.add_to(parser.add_subparsers(dest="command", required=True))
    try:
        args, unknown = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as error:  # the subparser exits on a bad value
        raise DcocoError(f"{argv[0]}: bad flags in {' '.join(argv[1:])}") from error
    if unknown:
        raise DcocoError(f"{argv[0]} does not take {' '.join(unknown)}")
    return command, config_from_args(command.config, args)


def stage_done(artefact: Path) -> bool:
    """Its provenance says it ran every step it planned."""
    try:
        record = json.loads((artefact / "provenance.json").read_text())
    except (OSError, ValueError):
        return False
    return record.get("steps") == record.get("total_steps")


Execute = Callable[[Command, object], None]


def run_command(command: Command, config) -> None:
    if command.run(config) != 0:
        raise DcocoError(f"{command.name} failed")


def run_recipe(
    recipe: Recipe,
    runs: Path,
    threads: int = 0,
    dry_run: bool = False,
    execute: Execute = run_command,
    target: str = "",
) -> list[str]:
    """Run every stage not finished yet, in order; returns what each stage did."""
    # Every stage's flags are checked before the first one trains (inits may not exist yet).
    planned = [(s, stage_argv(runs, recipe, s, threads, target)) for s in recipe.stages]
    parsed = [parse_stage(argv) for _, argv in planned]
    report = []
    for (stage, argv), (command, config) in zip(planned, parsed, strict=True):
        line = "dcoco " + " ".join(argv)
        if stage_done(artefact_dir(runs, recipe, stage)):
            report.append(f"done     {stage.name}: {line}")
            continue
        if dry_run:
            report.append(f"to run   {stage.name}: {line}")
            continue
        print(f"dcoco recipe: stage {stage.name}: {line}", file=sys.stderr)
        execute(command, config)
        report.append(f"ran      {stage.name}: {line}")
    return report


def ship(recipe: Recipe, runs: Path, dest_root: Path | None = None) -> Path:
    """Copy the finished last stage's checkpoint and every stage's log into the catalogue folder."""
    last = recipe.stages[-1]
    artefact = artefact_dir(runs, recipe, last)
    if not stage_done(artefact):
        raise DcocoError(f"stage '{last.name}' has not finished ({artefact}): run the recipe first")
    dest = (dest_root or checkpoints_dir() / recipe.target) / recipe.checkpoint
    dest.mkdir(parents=True, exist_ok=True)
    for path in artefact.iterdir():
        shutil.copy2(path, dest / path.name)
    for stage in recipe.stages:
        log = stage_dir(runs, recipe, stage) / LOG_FILE
        name = LOG_FILE if stage is last else f"{stage.name}_{LOG_FILE}"
        if log.is_file():
            shutil.copy2(log, dest / name)
    return dest


@dataclass
class RecipeConfig:
    recipe: str = ""  # the recipe file (recipes/<target>/<checkpoint>.toml)
    runs: str = ""  # where the stages run; empty = $DCOCO_CACHE_DIR/runs
    threads: int = 0  # torch CPU threads of every stage; 0 = the recipe's own
    dry_run: bool = False  # print each stage's command and whether it is done, and the plan
    target: str = ""  # the target model directory for every stage; empty = each stage's own
    ship: bool = False  # copy the finished checkpoint into checkpoints/<target>/<checkpoint>/


def run(config: RecipeConfig) -> int:
    recipe = read_recipe(Path(config.recipe))
    runs = Path(config.runs) if config.runs else cache_dir() / "runs"
    if config.ship:
        print(f"dcoco recipe: shipped {ship(recipe, runs)}", file=sys.stderr)
        return 0
    for line in run_recipe(recipe, runs, config.threads, config.dry_run, target=config.target):
        print(line)
    if config.dry_run:
        for line in plan_lines(recipe, config.target):
            print(line)
    return 0


def plan_lines(recipe: Recipe, target: str) -> list[str]:
    """The recipe's cost (dcoco.train.recipe_plan) where its first stage trains a fresh drafter
    for a target whose config is known: the recipe's [target_config], or `target`'s config.json."""
    first = recipe.stages[0]
    target_config = recipe.target_config
    if not target_config and target and (Path(target) / "config.json").is_file():
        target_config = json.loads((Path(target) / "config.json").read_text())
    if first.init or not target_config:
        return ["plan     needs a fresh first stage and the target's config ([target_config])"]
    from dcoco.train.recipe_plan import plan

    return plan(target_config, first.flags, [s.flags for s in recipe.stages]).lines()


COMMAND = Command(
    "recipe",
    "train a shipped checkpoint from its recipe, stage by stage (resumable), or ship it",
    RecipeConfig,
    run,
    description="Run the stages of recipes/<target>/<checkpoint>.toml in order, each a "
    "train-drafter or train-corrector run under <runs>/<checkpoint>/<stage>/; finished stages "
    "are skipped and an interrupted one resumes, so rerun the same command after a kill. "
    "--ship then copies the result into checkpoints/<target>/<checkpoint>/.",
    positional=("recipe",),
)
