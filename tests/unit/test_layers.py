"""The package's imports run one way: no import cycle, no import that climbs the layers written in
docs/architecture.md, and no function-local import outside `cli/` but lazy optional ones (with a comment).

Every import counts, function-local ones and those under `TYPE_CHECKING` too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "dynaforge"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def documented_layers(text: str) -> list[set[str]]:
    """The layers between the `layers:start` and `layers:end` markers, bottom first."""
    block = re.search(r"<!-- layers:start -->\s*```\n(.*?)```\s*<!-- layers:end -->", text, re.S)
    assert block, "docs/architecture.md has no layers block"
    return [set(line.split()) for line in block.group(1).splitlines() if line.strip()]


class Import(NamedTuple):
    source: str
    target: str
    line: int
    local: bool
    """Inside a function body."""
    text: str


def module_name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: Path) -> Iterator[Import]:
    """Every import of the package's modules that names a module of the package."""
    modules = {module_name(package, p): p for p in package.rglob("*.py")}
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        local_nodes = {
            id(sub)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for sub in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            local = id(node) in local_nodes
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]  # `from pkg.mod import name` -> pkg.mod
                if target or local:
                    yield Import(name, target, node.lineno, local, lines[node.lineno - 1].strip())


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def climbs(found: list[Import], layers: list[set[str]]) -> list[str]:
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    return [
        f"{i.source} imports {i.target} (line {i.line}): {room(i.target)} is above {room(i.source)}"
        for i in found
        if i.target and rank[room(i.target)] > rank[room(i.source)]
    ]


def cycles(found: list[Import]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for i in found:
        graph.setdefault(i.source, set())
        if i.target and i.target != i.source and i.target != i.source.split(".")[0]:
            graph[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def stray_local_imports(found: list[Import]) -> list[str]:
    """Function-local imports outside `cli/`: allowed only for other packages, with a `# lazy:` comment."""
    return sorted(
        {
            f"{i.source} line {i.line}: {i.text}"
            for i in found
            if i.local and room(i.source) != "cli" and (i.target or "# lazy:" not in i.text)
        }
    )


def test_every_room_has_a_layer() -> None:
    layers = documented_layers(ARCHITECTURE.read_text())
    placed = set().union(*layers)
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    rooms -= {"__pycache__"}
    assert rooms - placed == set(), "rooms without a layer in docs/architecture.md"


def test_no_import_cycle_and_no_import_that_climbs() -> None:
    found = list(imports(PACKAGE))
    assert len({i.source for i in found}) > 100  # the whole package was read
    assert cycles(found) == []
    assert climbs(found, documented_layers(ARCHITECTURE.read_text())) == []


def test_function_local_imports_are_lazy_optional_dependencies() -> None:
    assert stray_local_imports(list(imports(PACKAGE))) == []


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A package with a cycle (a <-> b through a function-local import), a climb (low imports high) and a
    stray function-local import of the package."""
    package = tmp_path / "toy"
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "high" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("from toy.low import b\n")
    (package / "low" / "b.py").write_text("def f():\n    from toy.low.a import x\n")
    (package / "low" / "c.py").write_text("import toy.high.d\n")
    (package / "high" / "d.py").write_text("def g():\n    import numpy  # lazy: optional\n")
    return package


def test_the_checks_catch_a_cycle_a_climb_and_a_stray_local_import(toy: Path) -> None:
    found = list(imports(toy))
    layers = documented_layers("<!-- layers:start -->\n```\n__init__ low\nhigh\n```\n<!-- layers:end -->")
    assert cycles(found) == [["toy.low.a", "toy.low.b"]]
    assert [c.split(" (")[0] for c in climbs(found, layers)] == ["toy.low.c imports toy.high.d"]
    assert stray_local_imports(found) == ["toy.low.b line 2: from toy.low.a import x"]
