"""Imports flow one way: cli -> commands (eval / train / serving / data) -> decode -> models ->
contracts / config -> leaf modules. Inside models: heads -> drafter -> target -> cpu (the kernels).
Every import counts, module-level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import dcoco

PACKAGE = Path(dcoco.__file__).parent
# Longest prefix wins. A module may import its own layer or a lower one, never a higher one.
LAYERS = {
    "dcoco": 0,
    "dcoco.errors": 0,
    "dcoco.paths": 0,
    "dcoco.contracts": 1,
    "dcoco.config": 1,
    "dcoco.models": 2,
    "dcoco.models.cpu": 2,
    "dcoco.models.target": 3,
    "dcoco.models.drafter": 4,
    "dcoco.models.heads": 5,
    "dcoco.decode": 6,
    "dcoco.data": 7,
    "dcoco.eval": 7,
    "dcoco.train": 7,
    "dcoco.serving": 7,
    "dcoco.generate": 7,
    "dcoco.cli": 8,
    "dcoco.__main__": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} is in no layer: add it to LAYERS"
    return LAYERS[max(prefixes, key=len)]


def imported(module: str) -> set[str]:
    """The dcoco modules `module` imports, wherever in the file the import statement sits."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import (dcoco imports absolutely)"
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: imported(module) for module in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, then "done"
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                return stack[stack.index(child) :] + [child]
            if child not in state and (cycle := visit(child)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


def test_no_import_reaches_up_a_layer():
    upward = sorted(
        f"{source} (layer {layer(source)}) imports {target} (layer {layer(target)})"
        for source, targets in GRAPH.items()
        for target in targets
        if layer(target) > layer(source)
    )
    assert not upward, "imports that reach up:\n" + "\n".join(upward)


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_package_folder_holds_more_than_20_files():
    crowded = {
        str(folder.relative_to(PACKAGE.parent)): count
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if "__pycache__" not in folder.parts
        and (count := sum(1 for f in folder.iterdir() if f.is_file())) > 20
    }
    assert not crowded, f"folders over 20 files (split them by what they hold): {crowded}"


def test_the_walk_sees_function_level_imports_and_finds_cycles():
    # decode.methods imports the drafter loader inside build_proposer only
    assert "dcoco.models.drafter.drafter_io" in GRAPH["dcoco.decode.methods"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
