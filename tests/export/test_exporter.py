"""The in-process wiring: source -> aggregator -> snapshot -> app, on the narrow interfaces."""

import inspect

from graphmon.export.exporter import Exporter
from graphmon.export.exposition import FORMATS
from graphmon.export.server import create_app
from graphmon.settings import Settings
from graphmon.sources.replay import ReplaySource

from helpers import synthetic_trace, window


def test_create_app_takes_narrow_arguments_only():
    params = inspect.signature(create_app).parameters
    assert list(params)[:5] == ["snapshots", "capture", "trace_lookup", "settings", "extra_status"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params.values())


def test_publish_prerenders_every_format_and_names_the_process():
    ex = Exporter(ReplaySource(synthetic_trace()), Settings(rank="3"))
    ex.aggregator.ingest(window(synthetic_trace()))
    r = ex.app.state.renderer
    assert all(r.cached(f) is not None for f in FORMATS)
    p = ex.snapshot().process
    assert p["rank"] == "3" and p["pid"].isdigit() and p["host"]
