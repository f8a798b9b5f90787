"""Chrome / Perfetto trace output: tracks per stream, gaps in args, demangled kernel names."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import cxxfilt
from graphmon.formats import demangle as dm
from graphmon.formats.chrome import to_chrome_trace
from graphmon.formats.read import read_trace

from tracefiles import RAW

REDUCE = "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIN3c108BFloat16ENS0_7MeanOpsIS4_ffS4_EEjS4_Li4ELi8EEEEEvT1_"


@pytest.fixture(scope="module")
def raw_trace():
    t = read_trace(RAW, progress=False)
    return t.select(np.isin(t.correlation_id, np.unique(t.correlation_id)[:3]))


def test_kernel_names_are_demangled(raw_trace):
    doc = to_chrome_trace(raw_trace)
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert names and not any(n.startswith("_Z") for n in names)
    used = sorted({raw_trace.names[i] for i in raw_trace.name_id.tolist()})
    if shutil.which("c++filt"):  # binutils: the reference demangler
        want = subprocess.run(["c++filt"], input="\n".join(used) + "\n", capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
        assert names == set(want)


def test_demangle_known_name_and_fallbacks(monkeypatch):
    dm.demangle.cache_clear()
    assert dm.demangle(REDUCE).startswith("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, ")
    assert dm.demangle("add_kernel") == "add_kernel"  # a C name: unchanged
    assert dm.demangle("_Z!!not-a-name") == "_Z!!not-a-name"  # invalid: shown mangled
    assert dm.demangle("_Z" + "N" * 20_000) == "_Z" + "N" * 20_000  # overlong: not demangled
    # no libstdc++ on the host: cxxfilt raises on use; the mangled name is shown
    monkeypatch.setattr(cxxfilt, "default_demangler", cxxfilt.DeferedErrorDemangler(cxxfilt.LibraryNotFound("x")))
    dm.demangle.cache_clear()
    assert dm.demangle(REDUCE) == REDUCE
    dm.demangle.cache_clear()


def test_kernels_without_a_name(raw_trace):
    from dataclasses import replace

    t = replace(raw_trace, name_id=np.full(len(raw_trace), -1, np.int32))
    assert {e["name"] for e in to_chrome_trace(t)["traceEvents"] if e["ph"] == "X"} == {"kernel"}
