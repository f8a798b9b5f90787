import pytest


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/data/golden-metrics.txt from the current code")


@pytest.fixture
def regen_golden(request):
    return request.config.getoption("--regen-golden")
