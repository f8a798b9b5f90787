"""bench/exposition_speed.py: its smoke mode runs (and checks graphmon's bytes against
prometheus_client's for each level and format before timing them)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import exposition_speed  # noqa: E402


def test_smoke():
    assert exposition_speed.main(["--smoke"]) == 0
