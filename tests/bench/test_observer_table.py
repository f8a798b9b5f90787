"""bench/observer_table.py renders what the analysis wrote: a truth.json made from synthetic raw
data (known +500 ns per gap) and a folder with nothing in it. No GPU."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(__file__))
import observer_common as C  # noqa: E402
import observer_table as TB  # noqa: E402
import observer_truth as T  # noqa: E402
from test_observer_truth import raw_run  # noqa: E402


def test_tables_show_the_measured_inflation(tmp_path, capsys):
    st = C.Stages(str(tmp_path / "truth.json"))
    st.run("chain", lambda: T.analyze_truth(raw_run(pairs=2, block=4), n_boot=100))
    assert TB.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| chain | addx32 |"))
    cells = [c.strip() for c in row.split("|")]
    untraced, traced = (float(v) for v in cells[4].split(" -> "))
    assert abs((traced - untraced) - 32 * 500) < 32 * 20  # every gap 500 ns longer traced (+-10 ns jitter)
    assert cells[7] == "+0"  # CUPTI's window = the events' in the same replay
    assert any(line.startswith("| chain | ") and "us" not in line for line in out.splitlines())


def test_empty_folder_gives_headers_only_and_a_bad_path_the_usage(tmp_path, capsys):
    assert TB.main([str(tmp_path)]) == 0
    assert TB.main([str(tmp_path / "missing")]) == 2
    json.dumps(capsys.readouterr().out)
