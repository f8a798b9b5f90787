"""Exposition text of one rank's series (graphmon.export.families), written by hand.

Why not prometheus_client: it builds a Sample (a namedtuple with a labels dict) per sample and
formats it through a registry; at 64 ranks that was 84% of the agent's render thread (issue 38).
graphmon's metric and label names are valid by construction, so only label values are escaped;
the bytes are prometheus_client's for the same series (tests/export/test_textwriter.py), written
4.7x (text) and 7.1x (OpenMetrics) faster at the default level, 10-13x at full, for a rank with
64 graphs on 4 streams (bench/serve/exposition_speed.py, bench/results/exposition-speed.json). Sample
lines are the same in the text and OpenMetrics formats (only headers differ), so a rank's lines
are written once per snapshot, whichever formats are scraped.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Optional

from prometheus_client.utils import floatToGoString

from graphmon.export.exposition import escape_label_value
from graphmon.export.families import DEFAULT_LEVEL, Fam, rank_labels, rank_series
from graphmon.export.snapshot import Snapshot


@lru_cache(maxsize=1024)
def _layout(names: tuple, extra: Optional[str]) -> tuple[tuple[int, ...], int]:
    """Label positions in the order prometheus_client writes them (sorted by name), and where
    ``extra`` (le, quantile) falls among them."""
    keys = names + ((extra,) if extra else ())
    order = sorted(range(len(keys)), key=keys.__getitem__)
    if extra is None:
        return tuple(order), len(order)
    return tuple(i for i in order if i != len(names)), order.index(len(names))


def _num(v) -> str:
    # floatToGoString for ints below 1e6 is "<n>.0": the common case (counts) without the call
    if type(v) is int and -10**15 < v < 1_000_000:
        return f"{v}.0"
    return floatToGoString(v)


def write(fam: Fam, rows: list, const: tuple = (), esc: Optional[dict] = None) -> str:
    """The sample lines of ``rows`` (families.py's series of ``fam``) with the constant labels
    ``const`` ((name, value) pairs; left out where ``fam.per_rank`` is False)."""
    esc = {} if esc is None else esc
    cn = tuple(n for n, _ in const) if fam.per_rank else ()
    cv = tuple(v for _, v in const) if fam.per_rank else ()
    typ = fam.type
    name = fam.name + "_total" if typ == "counter" else fam.name
    extra = "le" if typ == "histogram" else "quantile" if typ == "summary" else None
    out: list[str] = []
    for row in rows:
        if fam.labels is None:
            names, vals = cn + tuple(n for n, _ in row[0]), cv + tuple(v for _, v in row[0])
        else:
            names, vals = cn + fam.labels, cv + row[0]
        order, k = _layout(names, extra)
        parts = []
        for i in order:
            v = vals[i]
            e = esc.get(v)
            if e is None:
                e = esc[v] = escape_label_value(v)
            parts.append(f'{names[i]}="{e}"')
        lab = ",".join(parts)
        brace = f"{{{lab}}}" if lab else ""
        if extra is None:
            out.append(f"{name}{brace} {_num(row[1])}\n")
            continue
        before, after = ",".join(parts[:k]), ",".join(parts[k:])
        pre, post = f"{before}," if before else "", f",{after}" if after else ""
        if typ == "histogram":
            head = f'{name}_bucket{{{pre}le="'
            tail = f'"{post}}} '
            out.extend(f"{head}{le}{tail}{_num(c)}\n" for le, c in zip(row[1], row[2]))
            out.append(f"{name}_count{brace} {_num(row[2][-1])}\n")
            out.append(f"{name}_sum{brace} {floatToGoString(row[3])}\n")
        else:  # summary
            out.extend(f'{name}{{{pre}quantile="{q}"{post}}} {floatToGoString(v)}\n' for q, v in row[1])
            if row[2] is not None:
                out.append(f"{name}_count{brace} {_num(row[2])}\n")
                out.append(f"{name}_sum{brace} {floatToGoString(row[3])}\n")
    return "".join(out)


def rank_chunks(snap: Snapshot, level: str = DEFAULT_LEVEL, extra_errors: Optional[Mapping[str, int]] = None,
                health_only: bool = False) -> dict[str, str]:
    """Family name -> sample lines of one snapshot (every family of its level, "" for none)."""
    const, esc = rank_labels(snap), {}
    return {fam.name: write(fam, rows, const, esc)
            for fam, rows in rank_series(snap, level, extra_errors, health_only)}
