"""Imports flow one way: cli -> commands (eval / train / serving / data) -> decode -> models ->
contracts / config -> leaf modules. Every import counts, module-level or inside a function."""

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
    "dcoco.decode": 3,
    "dcoco.data": 4,
    "dcoco.eval": 4,
    "dcoco.train": 4,
    "dcoco.serving": 4,
    "dcoco.generate": 4,
    "dcoco.cli": 5,
    "dcoco.__main__": 5,
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


def test_the_walk_sees_function_level_imports_and_finds_cycles():
    # decode.methods imports the drafter loader inside build_proposer only
    assert "dcoco.models.drafter_io" in GRAPH["dcoco.decode.methods"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
