"""The real H200 traces, read once per test module (tests/data/)."""

import pytest

from graphmon.formats.read import read_trace
from helpers import KINETO, NATIVE


@pytest.fixture(scope="module")
def native():
    return read_trace(NATIVE, progress=False)


@pytest.fixture(scope="module")
def kineto():
    return read_trace(KINETO, progress=False)
