"""The package's layers: ``grammar`` (bottom) < ``pipeline`` < ``adapters`` (top).

Every module under ``src/grammask`` is parsed with :mod:`ast` and every import statement is read,
at module level or inside a function, absolute or relative: ``grammask.grammar`` may import neither
``grammask.pipeline`` nor ``grammask.adapters``; ``grammask.pipeline`` may not import
``grammask.adapters``. (``errors`` and the package root are shared; the ``cli`` sits on top.)
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "grammask"

#: layer -> the layers it must not import
FORBIDDEN = {
    "grammask.grammar": ("grammask.pipeline", "grammask.adapters"),
    "grammask.pipeline": ("grammask.adapters",),
}


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, src: Path = SRC) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in the file; ``from X import a, b`` yields
    ``X`` and ``X.a``, ``X.b`` (``a`` may be a submodule)."""
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            found.extend((node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*")
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name in ("import_module", "__import__") and bool(node.args)


def _within(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def violations(root: Path = PACKAGE) -> list[str]:
    src = root.parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, src)
        for layer, forbidden in FORBIDDEN.items():
            if not _within(name, layer):
                continue
            seen_lines = set()
            for line, mod in imported_modules(path, src):
                if line not in seen_lines and any(_within(mod, f) for f in forbidden):
                    seen_lines.add(line)
                    bad.append(f"{path.relative_to(src)}:{line}: {name} imports {mod}")
    return bad


def test_layers_import_downward_only():
    bad = violations()
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("from ..adapters import server\n", True),                       # relative, module level
    ("def f():\n    from ...adapters.models import x\n", True),      # relative, lazy, deeper
    ("import grammask.pipeline.engine\n", True),                     # absolute
    ("def f():\n    import importlib\n    importlib.import_module('grammask.adapters.server')\n", True),
    ("from .. import pipeline\n", True),                             # a layer imported as a name
    ("from ..errors import GrammarError\nfrom . import cfg\nimport numpy\n", False),
])
def test_the_checker_sees_every_form(tmp_path, source, expected):
    root = tmp_path / "src" / "grammask"
    (root / "grammar" / "sub").mkdir(parents=True)
    for d in (root, root / "grammar", root / "grammar" / "sub"):
        (d / "__init__.py").write_text("")
    # "deeper" needs three dots: put that case one package down
    target = root / "grammar" / ("sub" if "..." in source else "") / "m.py"
    target.write_text(source)
    assert bool(violations(root)) is expected
