"""Readable kernel names: Itanium C++ ABI names (``_Z...``) demangled for display.

Uses ``cxxfilt``, a thin ctypes wrapper around libstdc++'s own ``__cxa_demangle`` (the demangler
GCC, binutils' c++filt and the CUDA tools agree with). Measured on every mangled kernel name in
tests/data (bench/formats/demangle_names.py -> bench/results/demangle.json): cxxfilt matched c++filt on
all of them; the pure-Python itanium_demangler failed on 8 of 13 and cpp_demangle (Rust) printed
template arguments differently on 12 of 13. Anything that cannot be demangled (no libstdc++ on the
host, an invalid or overlong name) is shown mangled: display only, never an error.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

# Longer names are shown mangled: bounds the time and the demangler's recursion on a name read
# from an untrusted file (real kernel names are under 2 kB; the longest in tests/data is 282 B).
MAX_DEMANGLE_CHARS = 16_384


@lru_cache(maxsize=65_536)
def demangle(name: str) -> str:
    """``name`` demangled when it is a valid mangled C++ name, else ``name`` unchanged."""
    if not name.startswith("_Z") or len(name) > MAX_DEMANGLE_CHARS:
        return name
    try:
        import cxxfilt  # lazily: finding libstdc++ runs ldconfig once

        out = cxxfilt.demangle(name, external_only=True)
    except Exception:  # noqa: BLE001 - cxxfilt.Error, ImportError, OSError, UnicodeError: show it mangled
        return name
    return out or name


def demangle_all(names: Iterable[str]) -> list[str]:
    return [demangle(n) for n in names]
