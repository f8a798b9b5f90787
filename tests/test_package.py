"""The graphmon package's shape: no module over 500 lines, no import cycle (issue 29).

An AST walk over graphmon's own source (nothing is imported, so optional dependencies do not
matter). Imports inside functions count for a cycle as much as module-level ones: a function-
level import only defers the dependency, it does not remove it, and it is how a cycle hides
(sources/cupti/api.py and libinfo.py imported each other that way). Imports under
``if TYPE_CHECKING:`` count too: annotations are part of what a module depends on. An implicit
import of a parent package (Python runs ``graphmon/__init__.py`` before any submodule) is not an
edge: it is not a dependency the importing module chose.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "graphmon"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """graphmon modules that ``name`` imports, anywhere in the file."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in known:  # `from pkg import module`
                    out.add(sub)
                elif mod in known:  # `from module import name`
                    out.add(mod)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def test_no_module_over_500_lines():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, f"import cycles: {found}"


@pytest.mark.parametrize("edges, expect", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_cycles(edges, expect):
    assert cycles(edges) == expect


def test_function_level_and_relative_imports_are_edges(tmp_path, monkeypatch):
    pkg = tmp_path / "graphmon" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "graphmon" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from graphmon.sub.b import g\n    return g\n")
    (pkg / "b.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "graphmon")
    assert cycles(import_graph()) == [["graphmon.sub.a", "graphmon.sub.b"]]


def test_pyproject_license_is_an_spdx_expression_and_the_build_warns_of_nothing():
    """PEP 639: ``project.license`` is an SPDX string (the TOML table is deprecated, setuptools
    warns and stops accepting it in 2027), which needs setuptools >= 77 in build-system.requires.
    The metadata build is run for real (pip, isolated build with the declared backend): its
    verbose output carries setuptools' warnings."""
    import re
    import subprocess

    text = (ROOT.parent / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2\.0"$', text, re.M)
    assert int(re.search(r'^requires = \["setuptools>=(\d+)"', text, re.M).group(1)) >= 77
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--dry-run", str(ROOT.parent)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "from versions: none" in r.stderr:
        pytest.skip("no package index here for the isolated build's setuptools")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Would install graphmon" in r.stdout
    assert not re.search(r"Deprecat", r.stdout + r.stderr), re.findall(r".*Deprecat.*", r.stdout + r.stderr)[:3]
