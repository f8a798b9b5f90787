"""Every bench runs as shipped (bench/README.md), so that a moved or renamed name fails here and
not for the next reader:

- the layout: scripts only in question folders, helpers only in bench/common, every file <= 500
  lines, graphmon never imports bench, bench/README.md names every script;
- every script answers ``--help`` with its usage, exit 0 (a device call's .sh too);
- every CPU script runs its ``--smoke`` mode (seconds; a script with ``DEVICE = "gpu"`` is a GPU
  bench and is not run), and no smoke run touches a recorded result;
- every script and helper imports with torch, transformers, triton and cupti unavailable (GPU
  benches import them when they run);
- every name a bench imports from graphmon or bench, or reads off a module it imported, exists
  (read from the module's source: GPU modules need not import here), and none of graphmon's is
  private.

Scripts are found by folder: a new bench needs no entry here. ``NEEDS = ("prometheus",)`` in a
script names executables its smoke run needs (skipped without them; prometheus and promtool are
required when GRAPHMON_REQUIRE_PROMETHEUS=1, as in CI). The runs go in parallel (WORKERS).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
from _promutil import require_binary

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
MAX_LINES = 500
SMOKE_MAX_S = 90  # a smoke run is seconds long; this bound catches one that runs the real thing
WORKERS = 4  # subprocesses at once: most smoke runs wait on servers and sockets, not the CPU
GPU_STACK = ("torch", "transformers", "triton", "cupti")
FOLDERS = sorted(d for d in BENCH.iterdir() if d.is_dir() and d.name not in ("common", "results", "__pycache__"))
SCRIPTS = sorted(p for d in FOLDERS for p in d.glob("*.py") if p.name != "__init__.py")
HELPERS = sorted(p for p in (BENCH / "common").glob("*.py") if p.name != "__init__.py")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHMON_") or k == "GRAPHMON_REQUIRE_PROMETHEUS"}


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def marker(path: Path, name: str):
    """The literal value of a top-level ``name = ...`` in a script (None when absent)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


CPU = [p for p in SCRIPTS if marker(p, "DEVICE") != "gpu"]


def run(args: list[str], timeout_s: float, env: dict = ENV) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        return r.returncode, r.stdout, r.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        return -1, str(e.stdout or ""), f"timed out after {timeout_s} s", time.monotonic() - t0


def parallel(fn, items) -> dict:
    with ThreadPoolExecutor(WORKERS) as ex:
        return dict(zip(items, ex.map(fn, items)))


def missing_needs(script: Path) -> list[str]:
    return [exe for exe in marker(script, "NEEDS") or () if shutil.which(exe) is None]


def tree_digest(*dirs: Path) -> dict[str, str]:
    return {rel(p): hashlib.sha256(p.read_bytes()).hexdigest() for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------- layout
def test_scripts_live_in_question_folders_and_stay_short():
    assert [p.name for p in BENCH.glob("*.py")] == ["__init__.py"]  # bench/ itself holds folders only
    assert all((d / "__init__.py").is_file() and set(d.glob("*.py")) - {d / "__init__.py"} for d in FOLDERS), \
        "a question folder without a bench or without its __init__.py (the question, one line)"
    long = [f"{rel(p)}: {n}" for p in SCRIPTS + HELPERS if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


def test_graphmon_never_imports_bench():
    found = [rel(p) for p in (ROOT / "graphmon").rglob("*.py")
             if re.search(r"^\s*(from|import)\s+bench\b", p.read_text(), re.M)]
    assert not found


def test_bench_readme_indexes_every_script_and_helper():
    text = (BENCH / "README.md").read_text()
    files = SCRIPTS + HELPERS + sorted(BENCH.glob("*/*.sh"))
    missing = [rel(p) for p in files if f"{p.parent.name}/{p.name}" not in text]
    assert not missing, f"bench/README.md does not name {missing}"
    named = set(re.findall(r"`(\w+/\w+\.(?:py|sh))`", text))
    gone = [n for n in named if not (BENCH / n).is_file() and not (ROOT / n).is_file()]
    assert named and not gone, f"bench/README.md names {gone}: gone"


# ---------------------------------------------------------------------- --help and --smoke
@pytest.fixture(scope="module")
def helps() -> dict:
    return parallel(lambda p: run([str(p), "--help"], 60), SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=rel)
def test_every_script_answers_help(helps, script):
    rc, out, err, _ = helps[script]
    assert rc == 0 and out.startswith("usage: "), f"exit {rc}\n{out[-1000:]}\n{err[-2000:]}"


@pytest.mark.parametrize("script", sorted(p for d in FOLDERS for p in d.glob("*.sh")), ids=rel)
def test_every_device_call_script_answers_help(script):
    r = subprocess.run(["bash", str(script), "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and f"bash {rel(script)}" in r.stdout, r.stdout + r.stderr


@pytest.fixture(scope="module")
def smokes(tmp_path_factory) -> dict:
    recorded = (BENCH / "results", ROOT / "docs" / "ab")
    before = tree_digest(*recorded)
    runnable = [p for p in CPU if not missing_needs(p)]
    env = dict(ENV, TMPDIR=str(tmp_path_factory.mktemp("smoke")))  # where smoke runs write: pytest cleans it
    runs = parallel(lambda p: run([str(p), "--smoke"], 2 * SMOKE_MAX_S, env), runnable)
    after = tree_digest(*recorded)
    return {"runs": runs, "changed": sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))}


@pytest.mark.parametrize("script", CPU, ids=rel)
def test_every_cpu_bench_runs_its_smoke_mode(smokes, script):
    for exe in missing_needs(script):
        if exe in ("prometheus", "promtool"):
            require_binary(exe)  # fails under GRAPHMON_REQUIRE_PROMETHEUS=1, else skips
        pytest.skip(f"{exe} not on PATH")
    rc, out, err, seconds = smokes["runs"][script]
    assert rc == 0, f"exit {rc}\n{out[-1000:]}\n{err[-3000:]}"
    assert seconds < SMOKE_MAX_S, f"a smoke run of {seconds:.0f} s"


def test_smoke_runs_leave_recorded_results_alone(smokes):
    assert smokes["changed"] == []


# ---------------------------------------------------------------------- imports
def module_of(p: Path) -> str:
    return ".".join(p.relative_to(ROOT).with_suffix("").parts)


def test_every_bench_imports_without_the_gpu_stack():
    code = ("import importlib, json, sys, traceback\n"
            f"for m in {GPU_STACK!r}:\n    sys.modules[m] = None  # import m raises ImportError\n"
            "failed = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(name)\n"
            "    except BaseException:\n        failed[name] = traceback.format_exc(limit=4)\n"
            "print(json.dumps(failed))\n")
    rc, out, err, _ = run(["-c", code, *(module_of(p) for p in SCRIPTS + HELPERS)], 120)
    assert rc == 0, err[-3000:]
    failed = json.loads(out.splitlines()[-1])
    assert not failed, "\n".join(f"{k}:\n{v}" for k, v in failed.items())


def source_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@lru_cache(maxsize=None)
def defined_names(path: Path) -> frozenset[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports), also
    inside top-level if/try blocks; for a package, its submodules too."""
    names: set[str] = set()

    def visit(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                      + [n for h in getattr(node, "handlers", []) for n in h.body])

    visit(ast.parse(path.read_text()).body)
    if path.name == "__init__.py":
        names.update(p.stem for p in path.parent.glob("*.py"))
        names.update(d.name for d in path.parent.iterdir() if (d / "__init__.py").is_file())
    return frozenset(names)


def test_every_name_a_bench_uses_from_graphmon_or_bench_exists_and_is_public():
    problems = []
    for p in SCRIPTS + HELPERS:
        tree = ast.parse(p.read_text())
        modules: dict[str, str] = {}  # local name -> the graphmon/bench module it is bound to
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in ("graphmon", "bench"):
                pairs = [(node.module, a.name, a.asname or a.name) for a in node.names]
            elif isinstance(node, ast.Import):  # `import a.b` binds a; `import a.b as c` binds a.b
                pairs = [(a.name, None, a.asname or a.name.split(".")[0]) for a in node.names
                         if a.name.split(".")[0] in ("graphmon", "bench")]
            for module, name, local in pairs:
                src = source_of(module)
                where = f"{rel(p)}:{node.lineno}"
                if src is None:
                    problems.append(f"{where}: no module {module}")
                elif name is not None and name not in defined_names(src):
                    problems.append(f"{where}: {module} has no {name}")
                elif name and name.startswith("_") and module.startswith("graphmon"):
                    problems.append(f"{where}: {module}.{name} is private")
                bound = f"{module}.{name}" if name else (module if local != module.split(".")[0] else local)
                if source_of(bound) is not None:
                    modules[local] = bound
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                module, attr = modules[node.value.id], node.attr
                if attr not in defined_names(source_of(module)):
                    problems.append(f"{rel(p)}:{node.lineno}: {module} has no {attr}")
                elif attr.startswith("_") and not attr.startswith("__") and module.startswith("graphmon"):
                    problems.append(f"{rel(p)}:{node.lineno}: {module}.{attr} is private")
    assert not problems, "\n".join(problems)
