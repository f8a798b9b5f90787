"""What this graphmon is built from and runs with: ``graphmon --version`` and graphmon_build_info.

The git commit is known when graphmon runs from a checkout (an editable install, or the source
tree on sys.path) or was installed with pip from a local checkout (pip records the folder in
``direct_url.json``; that folder is asked, if it still exists). Otherwise it is "unknown": a
wheel carries no commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from functools import lru_cache
from typing import Optional

from graphmon.version import __version__

_PKG = os.path.dirname(os.path.abspath(__file__))


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return ""


def _git_head(folder: str) -> Optional[str]:
    if not os.path.exists(os.path.join(folder, ".git")):
        return None
    try:
        r = subprocess.run(["git", "-C", folder, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                           timeout=5)
        head = r.stdout.strip() if r.returncode == 0 else ""
        if not head:
            return None
        dirty = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _installed_from() -> Optional[str]:
    """The local folder pip installed graphmon from (PEP 610 direct_url.json), if any."""
    try:
        from importlib.metadata import distribution

        text = distribution("graphmon").read_text("direct_url.json")
        url = json.loads(text or "{}").get("url", "")
    except Exception:
        return None
    return url[len("file://"):] if url.startswith("file://") else None


@lru_cache(maxsize=1)
def git_commit() -> str:
    """Short commit (+"-dirty" with uncommitted changes to tracked files), or "unknown"."""
    for folder in (os.path.dirname(_PKG), _installed_from()):
        if folder:
            head = _git_head(folder)
            if head:
                return head
    return "unknown"


def install_hint(extra: str) -> str:
    """How to add an extra to *this* installation: graphmon is installed from a checkout, so
    ``pip install '<that checkout>[extra]'`` (``'.[extra]'`` when run from it), with the pip of the
    Python that runs graphmon; ``graphmon[extra]`` only when it came from a package index."""
    pip = f"{sys.executable} -m pip install"
    source = _installed_from()
    if source is None and os.path.exists(os.path.join(os.path.dirname(_PKG), "pyproject.toml")):
        source = os.path.dirname(_PKG)  # the source tree itself (on sys.path, or an editable install)
    if source is None:
        return f"{pip} 'graphmon[{extra}]'"
    here = os.path.abspath(os.getcwd()) == os.path.abspath(source)
    return f"{pip} '{'.' if here else source}[{extra}]'"


def decode_path() -> str:
    """How CUPTI records are decoded here: "native" or why numpy (never imports cupti)."""
    try:
        from graphmon.sources.cupti.native import status

        return status()
    except Exception as e:  # noqa: BLE001 - a report line, never an error
        return f"unknown ({e!r})"


def details() -> dict[str, str]:
    import platform

    import numpy

    return {"graphmon": __version__, "commit": git_commit(),
            "python": f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
            "numpy": numpy.__version__, "prometheus-client": _dist_version("prometheus-client") or "not installed",
            "cupti-python": _dist_version("cupti-python") or "not installed", "decode": decode_path()}


def version_text() -> str:
    d = details()
    width = max(map(len, d))
    return f"graphmon {__version__}\n" + "\n".join(f"  {k + ':':<{width + 1}} {v}" for k, v in d.items() if k != "graphmon")


class VersionAction(argparse.Action):
    """``--version``: :func:`version_text`, then exit (build details are read only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()
