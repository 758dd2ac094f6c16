"""The package's import graph: no circles, and no private names imported across
modules.

The graph is read from the source (every ``import`` and ``from ... import``,
module-level or inside a function), so an import hidden in a function body to
break a circle at run time still counts. Imports under ``if TYPE_CHECKING:`` are
left out: they name types for the checker and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "energyopt"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    hidden.update(id(n) for n in ast.walk(child))
    return hidden


def _imports(modules: dict[str, Path]) -> list[tuple[str, str, str | None]]:
    """(importer, imported module, imported name or None) for every import of a
    module of the package."""
    out: list[tuple[str, str, str | None]] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith(PACKAGE):
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in modules:
                        out.append((name, full, None))
                    else:
                        out.append((name, target, alias.name))
            elif isinstance(node, ast.Import):
                out.extend(
                    (name, alias.name, None)
                    for alias in node.names
                    if alias.name.startswith(PACKAGE)
                )
    return out


def test_the_reader_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The graph reader itself: a function-level import is an edge, one under
    TYPE_CHECKING is not (else the tests below could pass on a blind reader)."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from energyopt.b import Hidden\n"
        "def f():\n    from energyopt.c import _private\n"
    )
    tree = ast.parse(source)
    hidden = _type_checking_nodes(tree)
    seen = [
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and id(n) not in hidden and n.module != "typing"
    ]
    assert seen == ["energyopt.c"]


def test_no_import_circles() -> None:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for importer, imported, _ in _imports(modules):
        if imported in modules and imported != importer:
            # A package's __init__ re-exporting its own modules is not a circle
            # between them: only edges between modules outside that relation count.
            if importer.startswith(imported + ".") or imported.startswith(importer + "."):
                continue
            graph.add_edge(importer, imported)
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == [], f"import circles: {circles}"


def test_no_private_names_imported_across_modules() -> None:
    private = [
        f"{importer} imports {name} from {imported}"
        for importer, imported, name in _imports(_modules())
        if name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert private == [], "\n".join(private)


FACES = ("energyopt", "energyopt.__main__", "energyopt.api", "energyopt.cli", "energyopt.agent")
"""The faces above the families: the public API, the CLI and the node agent."""
REGISTRY = ("energyopt.families", "energyopt.families.contract")
"""The registry and the Family contract, which every family implements."""


def _family_of(module: str) -> str | None:
    """The family whose package holds ``module`` (``energyopt.families.<kind>...``)."""
    parts = module.split(".")
    if (
        len(parts) >= 3
        and parts[1] == "families"
        and f"energyopt.families.{parts[2]}" not in REGISTRY
    ):
        return parts[2]
    return None


def _is_face(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FACES if f != "energyopt") or (
        module == "energyopt"
    )


def test_the_families_are_packages_and_the_layers_import_none_of_them() -> None:
    """DESIGN's layout: one package per family under ``energyopt.families``; a family
    imports shared layers, the registry and its own modules, never another family;
    a shared layer imports no family (only the faces and the registry do)."""
    modules = _modules()
    families = {f for m in modules if (f := _family_of(m))}
    assert families == {
        "serving",
        "taskgraph",
        "colocation",
        "keepalive",
        "moe_edge",
        "serverless",
        "collective",
    }
    broken = []
    for importer, imported, _ in _imports(modules):
        home, target = _family_of(importer), _family_of(imported)
        if target is None or home == target:
            continue
        if home is not None:
            broken.append(f"family {home}: {importer} imports {imported}")
        elif not _is_face(importer) and importer not in REGISTRY:
            broken.append(f"shared layer {importer} imports {imported}")
    assert broken == [], "\n".join(broken)
