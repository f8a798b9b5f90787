"""Which libcupti this process loaded: its path, the wheel that shipped it, its API version.

Two copies of libcupti in one process (torch's and cupti-python's) is a real failure mode: the
buffer callbacks and the subscription would then live in different libraries. This module only
reads /proc/self/maps and wheel metadata; the call into libcupti for its API version is api.py's
(passed in as ``api_version``), so that api.py imports this module and never the reverse.
"""

from __future__ import annotations

import functools
import glob
import os
from typing import Callable, Optional


def loaded_libcupti_paths(maps_path: str = "/proc/self/maps") -> list[str]:
    """Absolute paths of every libcupti mapped into this process, sorted; [] when none or unreadable."""
    try:
        with open(maps_path) as fh:
            paths = sorted({ln.split(None, 5)[-1].strip() for ln in fh if "libcupti.so" in ln})
    except OSError:
        return []
    return [p for p in paths if p.startswith("/")]


def library_info(maps_path: str = "/proc/self/maps",
                 api_version: Optional[Callable[[str], Optional[int]]] = None) -> dict[str, str]:
    """The libcupti loaded in this process: path, the nvidia-cuda-cupti wheel version that
    shipped it (when it came from one) and, given ``api_version`` (api.cupti_api_version),
    cuptiGetVersion's API version. Empty when none is loaded. Never raises."""
    out: dict[str, str] = {}
    paths = loaded_libcupti_paths(maps_path)
    if not paths:
        return out
    out["cupti_lib"] = paths[0]
    if len(paths) > 1:
        out["cupti_libs_loaded"] = str(len(paths))  # two copies in one process: say so
    ver = wheel_version_of(paths[0])
    if ver:
        out["cupti_lib_version"] = ver
    api = api_version(paths[0]) if api_version is not None else None
    if api is not None:
        out["cupti_api_version"] = str(api)
    return out


def wheel_version_of(lib_path: str) -> str:
    """Version of the nvidia-cuda-cupti wheel whose RECORD lists ``lib_path``, or ''."""
    marker = f"{os.sep}nvidia{os.sep}"
    if marker not in lib_path:
        return ""
    root = lib_path[: lib_path.rindex(marker)]
    rel = os.path.relpath(lib_path, root)
    for d in sorted(glob.glob(os.path.join(root, "nvidia_cuda_cupti*-*.dist-info"))):
        try:
            with open(os.path.join(d, "RECORD")) as fh:
                if any(line.split(",", 1)[0] == rel for line in fh):
                    return os.path.basename(d)[: -len(".dist-info")].split("-", 1)[1]
        except OSError:
            continue
    return ""


@functools.lru_cache(maxsize=1)
def cupti_python_version() -> str:
    """The installed cupti-python's version, or '' (not installed, or metadata unreadable). Read
    once per process: package metadata is a scan of sys.path (ms), and every attach asks."""
    try:
        from importlib.metadata import version

        return version("cupti-python")
    except Exception:
        return ""
