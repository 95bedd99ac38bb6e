"""The package's layers: a module imports only from its own layer or the layers below it, and no
modules import each other in a circle (function-level imports included: they run too)."""
from __future__ import annotations

import ast
from pathlib import Path

import empathic_fusion

PACKAGE = Path(empathic_fusion.__file__).parent
# bottom first: shared parts (core) at the bottom, the entry points on top
# (models learn and log; evaluation, above them, reports on a tested module)
LAYERS = ("core", "dataset", "config", "utils", "metrics", "demo", "features", "datamodules", "models",
          "evaluation", "scoring", "pipeline", "app", "compose", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "conf" not in p.relative_to(PACKAGE).parts[:1]}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module of this package, line) for every import statement in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def _layer(module: str) -> int | None:
    """The layer index of a module (None: the package root, which only sets environment defaults)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else None


def _graph() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_every_subpackage_has_a_layer():
    assert {name.split(".")[1] for name in _modules() if "." in name} <= set(LAYERS) | {"conf"}


def test_no_module_imports_from_a_higher_layer():
    graph = _graph()
    # the reader sees imports at module and function level, absolute and relative
    assert "empathic_fusion.core.files" in {t for t, _ in graph["empathic_fusion.features.store"]}
    assert "empathic_fusion.models.predict" in {t for t, _ in graph["empathic_fusion.scoring.text"]}
    upward = [f"{module}:{line} imports {target}" for module, edges in graph.items() for target, line in edges
              if _layer(target) is not None and _layer(module) is not None and _layer(target) > _layer(module)]
    assert upward == []


def test_no_modules_import_each_other_in_a_circle():
    edges = {module: {target for target, _ in targets} for module, targets in _graph().items()}
    circles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_features_and_datamodules_import_nothing_from_text():
    graph = _graph()
    offending = [f"{m} imports {t}" for m, edges in graph.items() for t, _ in edges
                 if m.split(".")[1:2] in (["features"], ["datamodules"]) and t.startswith("empathic_fusion.text")]
    assert offending == []
