"""docs/, README.md and docker/: one socket path, no development history, negative gaps as the code
treats them."""

from __future__ import annotations

import re

from _promutil import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SHIPPED = DOCS + sorted(p for p in (ROOT / "docker").rglob("*") if p.is_file()) + [ROOT / "graphmon" / "cli.py"]
SOCKET = "/run/graphmon/agent.sock"


def test_one_socket_path_everywhere():
    from graphmon.host.link import AGENT_ENV

    assert AGENT_ENV == "GRAPHMON_AGENT"
    seen = set()
    for path in SHIPPED:
        text = path.read_text()
        for m in re.finditer(r"(?:/var)?/run/graphmon[\w./-]*", text):
            seen.add(m.group(0))
            assert m.group(0) in (SOCKET, SOCKET.rsplit("/", 1)[0]), f"{path.relative_to(ROOT)}: {m.group(0)}"
        for m in re.finditer(r"GRAPHMON_AGENT=(\S+?)[`\s\"']", text):
            assert m.group(1) in (SOCKET, "<socket>", "$SOCK"), f"{path.relative_to(ROOT)}: {m.group(0)}"
    assert SOCKET in seen


# What development history reads like: the docs say what the product is and does now; how it
# got there belongs in commit messages and bench/results.
HISTORY = re.compile(r"\b(issue\s+#?\d+|used to\b|no longer\b|since then\b|in this round\b|before the fix\b|"
                     r"the old default\b|now handles\b)", re.I)


def test_docs_hold_no_development_history():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in DOCS if p.parent.name == "docs"
             for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "\n".join(found)


def test_negative_gaps_are_documented_as_excluded_from_the_histogram():
    """The exporter counts overlaps in graphmon_kernel_gap_negative_total and leaves them out of
    the gap histogram (export/aggregator.py); no doc may put them in a bucket."""
    from graphmon.export import aggregator

    assert "(g.values >= 0)" in (ROOT / "graphmon" / "export" / "aggregator.py").read_text() and aggregator
    for p in DOCS:
        for line in p.read_text().splitlines():
            if re.search(r"negative gap|overlap", line, re.I):
                assert not re.search(r"(lowest|first|smallest) (histogram )?bucket", line, re.I), f"{p.name}: {line}"
    analysis = (ROOT / "docs" / "analysis.md").read_text()
    assert "counts it in `graphmon_kernel_gap_negative_total`" in analysis


# A bench, a result or a bench test cited by path: `bench/...`, `../bench/...`, `tests/bench/...`.
BENCH_PATH = re.compile(r"(?<![\w/])(?:\.\./)*((?:tests/)?bench/[\w./*-]*[\w*/])")


def test_every_cited_bench_or_result_path_exists():
    """README.md, docs/ and graphmon's comments point at benches and results that exist (a glob
    like soak-agent* must match a file); bench/README.md says which bench made each result."""
    cited, missing = 0, []
    for p in DOCS + sorted((ROOT / "graphmon").rglob("*.py")):
        for m in BENCH_PATH.finditer(p.read_text()):
            cited += 1
            path = m.group(1)
            if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{p.relative_to(ROOT)}: {path}")
    assert cited > 50 and not missing, "\n".join(missing)
