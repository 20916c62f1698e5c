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
