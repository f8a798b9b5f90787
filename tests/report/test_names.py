"""report/names.py: kernel names in tables are demangled, keep their function name, fit the width."""

import re

import pytest

from graphmon.formats.demangle import demangle
from graphmon.formats.read import read_trace
from graphmon.report.names import KERNEL_WIDTH, cut, display_kernel, fold

from helpers import KINETO, NATIVE

MANGLED = ("_ZN2at6native29vectorized_elementwise_kernelILi8ENS0_21CUDAFunctorOnSelf_addIN3c108BFloat16EEESt5arrayIPc"
           "Lm2EEEEviT0_T1_")


def _function(name: str) -> str:
    """The kernel's function name: the last identifier before its template arguments."""
    folded = fold(demangle(name))
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", folded.split("<", 1)[0])[-1]


def test_a_mangled_name_is_shown_demangled_with_its_function_and_template_start():
    got = display_kernel(MANGLED)
    assert got == "vectorized_elementwise_kernel<8, CUDAFunctorOnSelf_add…, std::array<…> >"
    assert display_kernel(MANGLED, None) == demangle(MANGLED) != MANGLED  # --wide: the whole demangled name


@pytest.mark.parametrize("path", [NATIVE, KINETO])
def test_every_real_kernel_name_fits_and_keeps_its_function_name(path):
    names = read_trace(path, progress=False).names
    assert names
    for n in names:
        got = display_kernel(n)
        assert len(got) <= KERNEL_WIDTH and not got.startswith("_Z"), got
        assert got.startswith(_function(n)), (got, n)
        if len(fold(demangle(n))) > KERNEL_WIDTH:
            assert "…" in got and got.endswith(">"), got  # cut inside the arguments, the closing > kept


def test_cut_takes_the_longest_argument_first_and_the_end_last():
    s = "kern<1, a_very_long_functor_name_here, B<…> >"
    assert cut(s, len(s)) == s
    got = cut(s, 30)
    assert got == "kern<1, a_very_long_f…, B<…> >" and len(got) == 30
    assert cut("a_function_name_without_templates_that_is_long", 20) == "a_function_name_wit…"
    assert len(cut(s, 12)) == 12  # too narrow for every argument's start: the end goes
