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
            # the socket, its folder, and the DaemonSet agent's --state-dir in that folder
            assert m.group(0) in (SOCKET, SOCKET.rsplit("/", 1)[0], SOCKET.rsplit("/", 1)[0] + "/state"), \
                f"{path.relative_to(ROOT)}: {m.group(0)}"
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


# ---------------------------------------------------------------- flags the docs name exist
OTHER_TOOLS_FLAGS = {"--no-deps"}  # pip's, in a `--no-deps` span of docs/deployment.md


def _graphmon_parsers() -> dict:
    from graphmon.cli import build_parser

    return dict(build_parser()._subparsers._group_actions[0].choices)


def _options(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def doc_command_lines(text: str) -> list[str]:
    """`graphmon SUB ...` command lines of a Markdown text: in fenced blocks (comments and
    `&&`/`;`/`|` pieces split off) and in code spans (which may wrap lines)."""
    out: list[str] = []
    fenced = False
    prose: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out += re.findall(r"\bgraphmon [a-z]+\b[^#;|&\n]*", line)
        else:
            prose.append(line)
    for span in re.findall(r"`([^`]+)`", "\n".join(prose)):
        out += re.findall(r"\bgraphmon [a-z]+\b[^#;|&]*", " ".join(span.split()))
    return out


def unknown_flags(cmd: str, parsers: dict) -> list[str]:
    words = cmd.split()
    sub = parsers.get(words[1])
    if sub is None:
        return []  # `graphmon serve` in a sentence, `graphmon link:` log text...
    flags = []
    for w in words[2:]:
        if w == "--":  # the command graphmon starts: its flags are its own
            break
        w = w.strip("[]()|,.'\"")
        if re.fullmatch(r"--[a-z][\w.-]*(=.*)?", w):
            flags.append(w.split("=")[0])
    return [f for f in flags if f not in _options(sub)]


def test_every_flag_the_docs_name_is_one_the_command_takes():
    """README and docs/ name only flags that exist: each `graphmon SUB ...` line's flags are SUB's,
    and a lone `--flag` code span is some graphmon command's (or the manifest generators')."""
    parsers = _graphmon_parsers()
    everyone = set().union(*(_options(p) for p in parsers.values())) | OTHER_TOOLS_FLAGS
    for script in (ROOT / "docker" / "k8s" / "generate.py", ROOT / "dashboards" / "generate.py"):
        src = script.read_text()
        everyone |= set(re.findall(r'add_argument\("(--[\w.-]+)"', src))
    bad, checked = [], 0
    for p in DOCS:
        text = p.read_text()
        for cmd in doc_command_lines(text):
            checked += 1
            bad += [f"{p.name}: {f} in `{cmd.strip()}`" for f in unknown_flags(cmd, parsers)]
        for span in re.findall(r"`(--[a-z][\w.-]*)[^`]*`", text):
            if span not in everyone:
                bad.append(f"{p.name}: `{span}` is no graphmon flag")
    assert checked > 30 and not bad, "\n".join(bad)


def test_the_flag_check_notices_a_wrong_flag():
    parsers = _graphmon_parsers()
    assert unknown_flags("graphmon agent --max-devices 4 --socket /run/graphmon/agent.sock", parsers) == []
    assert unknown_flags("graphmon agent --bogus 4", parsers) == ["--bogus"]
    assert unknown_flags("graphmon run --interval-s 3 -- vllm serve --port 8000", parsers) == []
    assert unknown_flags("graphmon serve --window-launches 4", parsers) == ["--window-launches"]  # run's, not serve's
    assert doc_command_lines("text `graphmon agent\n--bogus 1` more\n```bash\ngraphmon run --x -- y  # c\n```") == \
        ["graphmon run --x -- y  ", "graphmon agent --bogus 1"]
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
