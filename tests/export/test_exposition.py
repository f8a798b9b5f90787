"""/metrics bodies: negotiation, graphmon's renderers against prometheus_client, the render cache."""

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from starlette.testclient import TestClient

from graphmon.export.aggregator import Aggregator
from graphmon.export.collector import make_registry
from graphmon.export.exposition import OPENMETRICS, TEXT, negotiate, render
from graphmon.export.exporter import Exporter
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource

from helpers import synthetic_trace, window

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize("accept,fmt", [
    (PROMETHEUS_ACCEPT, OPENMETRICS),
    ("application/openmetrics-text;version=0.0.1", OPENMETRICS),
    ("application/openmetrics-text", OPENMETRICS),
    ("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5", TEXT),
    ("", TEXT), ("*/*", TEXT),
    ("application/openmetrics-text; version=abc", TEXT),  # old code: 500 + an http error counted
    ("application/openmetrics-text; version=1.0.7", TEXT),
    ("application/openmetrics-text;q=zz", TEXT),
])
def test_negotiate(accept, fmt):
    assert negotiate(accept) == fmt


def _registry():
    agg = Aggregator(backend_info={"backend": "replay", "source": 'a "quoted"\nname\\'})
    agg.ingest(window(synthetic_trace(n_graphs=2, n_streams=2, gap_ns=-50)))
    agg.ingest(window(synthetic_trace(n_graphs=2, n_streams=2), ended_s=1_800_000_001.0))
    return make_registry(agg.snapshots)


def test_renderers_are_byte_identical_to_prometheus_client():
    reg = _registry()
    assert render(reg, TEXT) == generate_latest(reg)
    assert render(reg, OPENMETRICS) == generate_openmetrics(reg)
    fams = {f.name for f in parse_openmetrics(render(reg, OPENMETRICS).decode())}  # the strict parser accepts it
    assert "graphmon_kernel_gap_seconds" in fams


def _exporter():
    ex = Exporter(ReplaySource(synthetic_trace(), name="t"), Settings())
    ex.aggregator.ingest(window(synthetic_trace()))
    return ex, TestClient(ex.app)


def test_render_cache_is_keyed_by_format_not_by_what_the_client_sends():
    ex, c = _exporter()
    renderer = ex.app.state.renderer
    before = renderer.renders
    for i in range(250):  # old code: 251 cached bodies, never evicted
        r = c.get("/metrics", headers={"accept": f"application/openmetrics-text; version=1.0.{i}"})
        assert r.status_code == 200
    assert set(renderer._cache) <= {TEXT, OPENMETRICS}
    # both formats were pre-rendered on publish; each again, compressed, at its first gzip request
    assert renderer.renders == before + 2


def test_bad_accept_version_is_answered_200_in_text_and_counts_no_error():
    ex, c = _exporter()
    r = c.get("/metrics", headers={"accept": "application/openmetrics-text; version=abc"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert ex.app.state.errors.snapshot() == {}


def test_a_scrape_during_a_render_gets_the_previous_body_instead_of_waiting():
    ex, c = _exporter()
    renderer = ex.app.state.renderer
    old = renderer.cached(TEXT)
    assert old is not None
    ex.aggregator.on_publish.clear()  # a new snapshot whose pre-render has not run yet
    ex.aggregator.ingest(window(synthetic_trace(), ended_s=1_800_000_005.0))
    assert renderer.cached(TEXT) is None
    with renderer._lock:  # a render in progress
        assert renderer.body(TEXT) is old
    assert renderer.body(TEXT) is not old  # once free, the current snapshot is rendered


def test_invalidate_waits_for_a_render_in_progress_so_its_body_is_not_served_after():
    """A render that began before invalidate() stores its body when it ends; invalidate() must
    drop that one too (a bare cache clear raced with it: test_containment's scrape-failure test
    was answered from a body rendered before the injected fault)."""
    import threading

    from graphmon.export.body import MetricsRenderer

    agg = Aggregator()
    entered, release = threading.Event(), threading.Event()

    def snaps():
        entered.set()
        release.wait(5)
        return agg.snapshots()

    r = MetricsRenderer(snaps)
    t = threading.Thread(target=r.body, args=(TEXT, False, "publish"))
    t.start()
    assert entered.wait(5)
    done = threading.Event()
    inv = threading.Thread(target=lambda: (r.invalidate(), done.set()))
    inv.start()
    assert not done.wait(0.2)  # waits for the render in progress
    release.set()
    t.join(5)
    inv.join(5)
    assert done.is_set() and r.cached(TEXT) is None
