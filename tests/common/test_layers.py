"""Every import points down (common/layers.py): a module imports its own package or a lower
layer, never a higher one, and never another package from inside a function (a hidden
import that dodges a cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

from common.layers import LAYERS, PACKAGES, ROOT, layer_of


def project_imports():
    """(file, line, importing module, imported module, at module level) for every import of a
    project module."""
    for package in PACKAGES:
        for path in sorted(Path(ROOT, package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(node) for node in tree.body} | {
                id(inner) for node in tree.body if isinstance(node, (ast.If, ast.Try))
                for inner in ast.walk(node)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                for name in names:
                    if layer_of(name) is not None:
                        yield path.relative_to(ROOT), node.lineno, module, name, id(node) in top_level


def test_every_import_points_down():
    upward = [f"{path}:{line}: {module} (layer {layer_of(module)}) imports {name} "
              f"(layer {layer_of(name)})"
              for path, line, module, name, _ in project_imports()
              if name.split(".")[0] != module.split(".")[0] and layer_of(name) >= layer_of(module)]
    assert not upward, "\n".join(upward)


def test_no_import_across_packages_inside_a_function():
    hidden = [f"{path}:{line}: {module} imports {name} inside a function"
              for path, line, module, name, top in project_imports()
              if not top and name.split(".")[0] != module.split(".")[0]]
    assert not hidden, "\n".join(hidden)


def test_no_two_packages_import_each_other():
    edges = {(module.split(".")[0], name.split(".")[0]) for _, _, module, name, _ in project_imports()}
    pairs = sorted({tuple(sorted(edge)) for edge in edges if edge[0] != edge[1] and edge[::-1] in edges})
    assert not pairs, pairs


def test_every_package_is_in_a_layer():
    on_disk = {path.parent.name for path in Path(ROOT).glob("*/__init__.py")} - {"tests", "examples", "bench"}
    assert on_disk == set(PACKAGES), on_disk ^ set(PACKAGES)
    assert len(PACKAGES) == len(set(PACKAGES)) == sum(len(layer) for layer in LAYERS)
