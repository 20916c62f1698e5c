"""The package reads as the pipeline: no module imports from a later stage, and no room grows too big."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "daemon" / "trainguard"

# Earlier stages never import later ones. Foundation modules (plain records and helpers) come first.
LAYERS = [
    {"records", "units", "clock", "redact", "rootcheck", "i18n", "guardspool"},
    {"config"},
    {"sources"},
    {"store"},
    {"detectors"},
    {"diagnosis"},
    {"alerts"},
    {"actions"},
    {"notify"},
    {"surfaces"},
    {"service"},
    {"cli", "__main__", "guard", "integrations"},
]
MAX_MODULE_LINES = 400


def _layer_of(module: str) -> int | None:
    top = module.split(".")[0]
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    return None


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if parts:
            yield path, ".".join(parts)


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainguard.") and not node.level:
            yield node.lineno, node.module.removeprefix("trainguard.")
        elif isinstance(node, ast.ImportFrom) and node.module == "trainguard":
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trainguard."):
                    yield node.lineno, alias.name.removeprefix("trainguard.")


def test_every_module_belongs_to_a_layer():
    unplaced = [name for _, name in _modules() if name != "__version__" and _layer_of(name) is None]
    assert not unplaced, f"modules outside the pipeline layers (add them to LAYERS): {unplaced}"


def test_no_import_from_a_later_stage():
    back_arrows = []
    for path, name in _modules():
        own = _layer_of(name)
        for lineno, imported in _imports(path):
            if imported == "__version__":
                continue
            theirs = _layer_of(imported)
            if own is not None and theirs is not None and theirs > own:
                back_arrows.append(f"{path.relative_to(PACKAGE)}:{lineno} imports trainguard.{imported}")
    assert not back_arrows, "an earlier stage imports a later one:\n" + "\n".join(back_arrows)


def test_modules_stay_small():
    big = [f"{path.relative_to(PACKAGE)} ({n} lines)" for path, _ in _modules()
           if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


MAX_FUNCTION_LINES = 60
# Functions over the limit that are being changed elsewhere; each leaves this list when it is split.
# (Qualified names: module.Class.function.)
FUNCTION_SIZE_EXEMPT: frozenset[str] = frozenset()


def _functions(tree: ast.AST, prefix: str):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def test_functions_stay_short():
    long_ones, names = [], set()
    for path, module in _modules():
        for name, node in _functions(ast.parse(path.read_text(), str(path)), f"{module}."):
            names.add(name)
            if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES and name not in FUNCTION_SIZE_EXEMPT:
                long_ones.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name} ({n} lines)")
    assert not long_ones, f"functions over {MAX_FUNCTION_LINES} lines (split them along a seam):\n" + "\n".join(long_ones)
    assert FUNCTION_SIZE_EXEMPT <= names, f"exempt functions that no longer exist: {FUNCTION_SIZE_EXEMPT - names}"


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:` (names for the type checker, never imported)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _module_edges() -> dict[str, set[str]]:
    """Module -> the package modules it imports, at the top or inside a function (both are a dependency)."""
    names = {name for _, name in _modules()}
    edges: dict[str, set[str]] = {}
    for path, name in _modules():
        out = edges.setdefault(name, set())
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                    node.module == "trainguard" or node.module.startswith("trainguard.")):
                base = node.module.removeprefix("trainguard").lstrip(".")
                for alias in node.names:  # `from trainguard.notify import texts_gpu` names a module
                    sub = f"{base}.{alias.name}" if base else alias.name
                    out.add(sub if sub in names else base)
            elif isinstance(node, ast.Import):
                out.update(a.name.removeprefix("trainguard.") for a in node.names if a.name.startswith("trainguard."))
        out &= names
        out.discard(name)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    """A module never depends on itself through others, not even by an import inside a function: each
    room can be read, tested and replaced from its dependencies up."""
    cycles = _cycles(_module_edges())
    assert not cycles, "modules that import each other, directly or in a circle:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_circle_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_detectors_are_rooms_a_reader_can_walk():
    big = [f"{path.name} ({n} lines)" for path in sorted((PACKAGE / "detectors").glob("*.py"))
           if (n := len(path.read_text().splitlines())) > 300]
    assert not big, f"detectors modules over 300 lines: {big}"
