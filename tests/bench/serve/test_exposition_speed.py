"""bench/serve/exposition_speed.py: its smoke mode runs (and checks graphmon's bytes against
prometheus_client's for each level and format before timing them)."""

from bench.serve import exposition_speed


def test_smoke():
    assert exposition_speed.main(["--smoke"]) == 0
