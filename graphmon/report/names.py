"""Kernel names for text tables: demangled (the demangler /trace uses), folded, cut to a width.

A table shows ``vectorized_elementwise_kernel<8, launch_clamp_scalar::{lambda#…, std::array<…> >``,
not ``_ZN2at6native29vectorized_elementwise_kernelILi8E…``: the function name survives, and a name
over the width loses the ends of its longest template arguments (the middle of the name), each
argument keeping its start. ``width=None`` (``--wide``) prints the demangled name whole.
"""

from __future__ import annotations

from graphmon.formats.demangle import demangle

KERNEL_WIDTH = 72  # two names per table row ("before -> after"): rows of ~200 columns; --wide for all
ELLIPSIS = "…"
MIN_ARG_CHARS = 6  # a template argument is not cut shorter than this (then the name's end goes)
_DROP = ("void ", "at::native::", "(anonymous namespace)::")


def fold(name: str) -> str:
    """Nested template arguments and the parameter list folded: ``f<8, A<…>, B<…> >``."""
    s = name
    for d in _DROP:
        s = s.replace(d, "")
    out: list[str] = []
    depth = 0
    for ch in s:  # a handful of names per table: a character loop is fine here
        if ch in "<(":
            depth += 1
            if depth == 2 and ch == "<":
                out.append("<" + ELLIPSIS + ">")
            elif depth == 1:
                out.append(ch)
        elif ch in ">)":
            depth = max(0, depth - 1)
            if depth == 0:
                out.append(ch)
        elif depth <= 1:
            out.append(ch)
    s = "".join(out).replace("()", "").replace("::operator const", "").strip()  # a lambda's call operator
    if s.endswith(")") and "(" in s:  # the parameter list of the kernel: not needed to recognise it
        s = s[: s.rindex("(")]
    return s


def _split_args(args: str) -> list[str]:
    """Top-level template arguments of ``args`` (the text between the outer < and >)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(args[start:i])
            start = i + 1
    out.append(args[start:])
    return out


def cut(s: str, width: int) -> str:
    """``s`` in at most ``width`` characters. The function name and every template argument's
    start survive: the longest argument loses its end first (``AUnaryFuncto…``,
    ``launch_clamp_scalar::{lam…``), then the next longest; a name whose function part alone is
    too long loses its end."""
    if len(s) <= width:
        return s
    lt, gt = s.find("<"), s.rfind(">")
    if 0 < lt < gt:
        head, args, tail = s[: lt + 1], _split_args(s[lt + 1 : gt]), s[gt:]
        while len(head) + len(tail) + len(",".join(args)) > width:
            i = max(range(len(args)), key=lambda k: len(args[k]))
            over = len(head) + len(tail) + len(",".join(args)) - width
            keep = max(MIN_ARG_CHARS, len(args[i]) - over - 1)
            if keep >= len(args[i]) - 1:  # every argument is down to its minimum: cut the end instead
                break
            args[i] = args[i][:keep].rstrip() + ELLIPSIS
        out = head + ",".join(args) + tail
        if len(out) <= width:
            return out
    return s[: width - 1] + ELLIPSIS


def display_kernel(name: str, width: int | None = KERNEL_WIDTH) -> str:
    """A kernel name for a table: demangled and folded, cut to ``width`` (None: the whole
    demangled name)."""
    readable = demangle(name)
    if width is None:
        return readable
    return cut(fold(readable), width)
