"""HTTP fuzz: schemathesis drives the app's own OpenAPI spec in-process (ASGI, no network).

Every operation gets schema-conforming and schema-violating requests (both generation modes);
the property is "never a 5xx". Bounded: a fixed number of examples per operation, no shrinking
deadline, about 30 s on 2 shared cores. Failures print a reproducible curl-like case.
"""

import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from graphmon.export.exporter import Exporter
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource

from helpers import synthetic_trace, window  # noqa: E402

EXAMPLES_PER_OPERATION = 100
SEEN: dict[str, set[int]] = {}  # operation -> status codes answered


def _exporter() -> Exporter:
    # Small captures so that POST /capture (wait_s up to 30) is answered quickly: the replay
    # source cuts a window as soon as it is asked.
    src = ReplaySource(synthetic_trace(n_graphs=2, n_streams=2, replays=30), interval_s=0.5, name="fuzz")
    ex = Exporter(src, Settings(max_capture_replays=50, max_capture_ms=50.0, token="fuzz-token"))
    for i in range(3):  # ids w1..w3 exist, so /trace/{id} reaches the rendering code too
        ex.aggregator.ingest(window(synthetic_trace(base_ns=10**9 * (i + 1))))
    return ex  # started by the module fixture: no thread of it runs while other modules' tests do


EXPORTER = _exporter()
schema = schemathesis.openapi.from_asgi("/openapi.json", EXPORTER.app)


@schema.hook
def flatmap_path_parameters(ctx, params):
    # Random ids almost never name a stored window: mix in ids that do (or their lookalikes),
    # so the trace rendering and download code is fuzzed too, not only the id validation.
    if not params or "trace_id" not in params:
        return st.just(params)
    stored = EXPORTER.store.ids()[-4:]  # the store evicts as windows arrive: ask it now
    known = st.sampled_from(stored + [i + j for i in stored[:1] for j in (" ", "/../w1", "%00")] + ["W1", "w0"])
    return st.one_of(st.just(params), known.map(lambda tid: {**params, "trace_id": tid}))


@pytest.fixture(scope="module", autouse=True)
def _run_exporter():
    EXPORTER.start()
    yield
    EXPORTER.stop(timeout_s=5)


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_operation_answers_5xx(case):
    response = case.call(headers={"Authorization": "Bearer fuzz-token"})  # past auth, into the handlers
    SEEN.setdefault(case.operation.label, set()).add(response.status_code)
    case.validate_response(response, checks=[not_a_server_error])


def test_fuzzing_reached_the_handlers():
    """The fuzz above is worthless if everything bounced off validation: every operation also
    answered 2xx at least once, and no handler error was contained (counted) on the way."""
    if not SEEN:
        pytest.skip("run together with test_no_operation_answers_5xx")
    assert {op for op, codes in SEEN.items() if not any(200 <= c < 300 for c in codes)} == set(), SEEN
    assert {op for op, codes in SEEN.items() if any(400 <= c < 500 for c in codes)}  # and 4xx were provoked
    errors = {**EXPORTER.snapshot().errors_total, **EXPORTER.app.state.errors.snapshot()}
    assert "http" not in errors and "scrape" not in errors
