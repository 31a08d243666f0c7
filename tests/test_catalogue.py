"""The checkpoint catalogue (dcoco.models.drafter.catalogue): checkpoints/ holds exactly the
catalogued checkpoints (each a default or a recipe's init) and the draft vocabulary, each head
carries the very drafter it is served with, and every method without `@` resolves to its
catalogued default."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dcoco.decode.methods import MethodOptions, checkpoint_dir, method_names, parse_method
from dcoco.models.drafter.catalogue import default_checkpoint, drafter_digest, read_catalogue
from dcoco.models.heads.head_io import head_kind_of
from dcoco.paths import REPO_ROOT

TARGET = "smollm2-135m-instruct"
ROOT = REPO_ROOT / "checkpoints" / TARGET
pytestmark = pytest.mark.skipif(not ROOT.is_dir(), reason="not a checkout")


def catalogue() -> dict:
    return read_catalogue(ROOT)


def test_checkpoints_holds_only_catalogued_checkpoints():
    shipped = {p.name for p in ROOT.iterdir() if p.is_dir()}
    assert shipped == set(catalogue())
    for name, entry in catalogue().items():
        assert entry["status"] in ("default", "supported"), name
        assert entry["recipe"] and entry["heldout"]["tau_3"] > 1.0, name
        assert (ROOT / name / "provenance.json").is_file(), name


def test_every_checkpoint_is_a_default_or_a_recipes_init_and_every_file_is_catalogued():
    import json
    import tomllib

    recipes = (REPO_ROOT / "recipes" / TARGET).glob("*.toml")
    inits = {s.get("init") for r in recipes for s in tomllib.loads(r.read_text())["stages"]}
    for name, entry in catalogue().items():
        assert entry["status"] == "default" or name in inits, f"{name} is superseded: remove it"
    draft_vocab = json.loads((ROOT / "catalogue.json").read_text())["draft_vocab"]
    files = {p.name for p in ROOT.iterdir() if p.is_file()} - {"catalogue.json"}
    assert files == set(draft_vocab["files"]) and draft_vocab["recipe"]


def test_each_checkpoint_is_the_kind_it_says_and_carries_its_drafter():
    entries = catalogue()
    for name, entry in entries.items():
        path = ROOT / name
        assert (head_kind_of(path) or "drafter") == entry["kind"], name
        assert drafter_digest(path) == entry["drafter_digest"], f"{name}: drafter digest changed"
        if entry["drafter"] == name and entry["kind"] != "drafter":  # trained jointly
            # it started from a catalogued checkpoint (a drafter, or a joint head trained on)
            assert entry["init"] in entries and entry["init"] != name, name
            assert drafter_digest(ROOT / entry["init"]) != drafter_digest(path), name
        elif entry["kind"] != "drafter":
            drafter = entries[entry["drafter"]]
            assert drafter["kind"] == "drafter", name
            # the head was trained over that drafter and is served with it: tensor for tensor
            assert drafter_digest(ROOT / entry["drafter"]) == drafter_digest(path), name


def test_every_drafter_method_resolves_to_its_catalogued_default():
    target = SimpleNamespace(name=TARGET)
    defaults = {}
    for name, entry in catalogue().items():
        for method in entry.get("serves", []):
            assert entry["status"] == "default" and method not in defaults, method
            defaults[method] = name
    drafter_methods = [m for m in method_names() if m not in ("plain", "pld")]
    assert set(defaults) == set(drafter_methods)
    for method in drafter_methods:
        assert default_checkpoint(ROOT, method) == defaults[method]
        assert (
            checkpoint_dir(parse_method(method), target, MethodOptions()) == ROOT / defaults[method]
        )


def test_a_head_default_is_trained_over_the_default_drafter():
    entries = catalogue()
    shipped_drafter = default_checkpoint(ROOT, "dflash")
    for method in ("dcoco", "dspark", "domino"):
        name = default_checkpoint(ROOT, method)
        entry = entries[name]
        # over the shipped drafter, or trained jointly from it (its own drafter inside), perhaps
        # through a joint head it trained on
        while entry["drafter"] == name and entry["kind"] != "drafter":
            name = entry["init"]
            entry = entries[name]
        assert entry["drafter"] == shipped_drafter, method


def test_no_catalogue_means_no_defaults(tmp_path: Path):
    assert read_catalogue(tmp_path) == {} and default_checkpoint(tmp_path, "dcoco") is None
