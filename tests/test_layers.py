"""The package's layers, written down once, and a check that imports only go down them.

Each layer may import from the layers listed before it (and from itself), never from one
listed after it; no two modules import each other, directly or through others. A new module
belongs to the layer of its folder; a new top-level module must be added here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"

# Bottom to top. A layer is a sub-package (every module under it) or a list of modules.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("gateway",)),  # the version and the error types
    ("settings", ("gateway.settings",)),  # YAML -> frozen settings; reads files, nothing else
    ("core", ("gateway.core",)),  # pure rules: no I/O, no clock, no asyncio
    ("store", ("gateway.store",)),  # records, leases, pacing windows
    ("observe", ("gateway.observe",)),  # audit, metrics, logs, traces, webhook notices
    ("provider", ("gateway.provider",)),  # the one HTTP client, credentials, sending
    ("flow", ("gateway.flow",)),  # the runtime container and the workflows of a poll
    ("http", ("gateway.http",)),  # agents' routes: a thin shell over flow
    ("operator", ("gateway.operator",)),  # operator API, console, OpenAPI, policy tools
    ("mcp", ("gateway.http.mcp",)),  # agents' MCP interface (over http's and flow's pieces)
    # the process: wiring, server, workers, and the files `statusgate init` writes
    (
        "wiring",
        ("gateway.run.app", "gateway.run.server", "gateway.run.workers", "gateway.run.shipped"),
    ),
    ("demo", ("gateway.demo",)),  # the shipped fake provider and walk-through
    ("entry", ("gateway.run", "gateway.run.cli", "gateway.run.__main__")),  # the command line
]
PURE = ("gateway.core",)
IMPURE = ("asyncio", "aiohttp", "time", "socket", "sqlite3", "redis", "random", "os")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best, found = -1, None
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if (module == member or module.startswith(member + ".")) and len(member) > best:
                best, found = len(member), index
    if found is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return found


def imports(path: Path, module: str) -> set[str]:
    """Every module of the package ``module`` imports (TYPE_CHECKING and function-level
    imports too: a dependency is a dependency)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "gateway" or name.startswith("gateway.")}


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for name in imports(path, module):
            while name not in files and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in files and name != module and not module.startswith(name + "."):
                targets.add(name)
        edges[module] = targets
    return edges


def upward(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if target == "gateway":
                continue  # the version string
            if layer_of(target) > layer_of(module):
                mine, theirs = LAYERS[layer_of(module)][0], LAYERS[layer_of(target)][0]
                found.append(f"{module} ({mine}) imports {target} ({theirs})")
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_imports_only_go_down_the_layers() -> None:
    """No module imports a module of a layer above its own."""
    assert upward(graph()) == []


def test_no_import_cycles() -> None:
    """No two modules depend on each other, directly or through others."""
    assert cycles(graph()) == []


def test_every_module_has_a_layer() -> None:
    """A module outside every layer fails here, naming where to add it."""
    for module in graph():
        layer_of(module)


def test_the_core_does_no_io() -> None:
    """The core imports no event loop, HTTP, clock, socket, database or randomness."""
    offenders = []
    for path in PACKAGE.joinpath("core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in IMPURE]
    assert offenders == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from gateway.flow.polls import gone\n", "imports gateway.flow.polls (flow)"),
        ("from gateway.http import proxy\n", "imports gateway.http.proxy (http)"),
    ],
)
def test_the_check_fails_on_an_upward_import(tmp_path: Path, source: str, expected: str) -> None:
    """The check itself: a core module importing a higher layer is reported."""
    copy = tmp_path / "gateway"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    (copy / "core" / "decide.py").write_text(source + (PACKAGE / "core/decide.py").read_text())
    found = upward(graph(copy))
    assert any(line.startswith("gateway.core.decide (core)") and expected in line for line in found)


def test_the_check_finds_a_cycle() -> None:
    """The check itself: a cycle of three modules is one component."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
