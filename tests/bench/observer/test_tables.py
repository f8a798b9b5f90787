"""bench/observer/tables.py renders what the analysis wrote: a truth.json made from synthetic raw
data (known +500 ns per gap) and a folder with nothing in it. No GPU."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_truth import raw_run  # noqa: E402

from bench.common import observer_stats as C  # noqa: E402
from bench.observer import tables as TB  # noqa: E402
from bench.observer import truth as T  # noqa: E402


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
    with pytest.raises(SystemExit) as e:  # argparse: the usage and one line on stderr
        TB.main([str(tmp_path / "missing")])
    assert e.value.code == 2 and "not a folder" in capsys.readouterr().err


def test_graph_trace_cost_measured_with_it_on_throughout_gets_a_row(tmp_path, capsys):
    # replay_signal's graph_trace stage: records_cost per kind of graph, accuracy per instance
    d = {"base": 1598.0, "other": 1614.5, "diff": 16.5, "diff_ci": [13.1, 20.4], "pct": 1.03, "pct_ci": [0.82, 1.28]}
    launch = {"base": 345.0, "other": 359.0, "diff": 14.2, "diff_ci": [-6.3, 30.4], "pct": 4.1, "pct_ci": [-1.7, 9.0]}
    acc = {f"decode_post{i}": {"minus_inner_span_ns": {"median": m}} for i, m in ((1, -8176.0), (2, -8096.0))}
    doc = {"stages": {"graph_trace": {"gt_on": {"accuracy": acc},
                                      "cost": {"graph_trace_records": {}, "decode": {"records_cost": {"gpu_us": d, "launch_us": launch}}}}}}
    (tmp_path / "signal.json").write_text(json.dumps(doc))
    assert TB.main([str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| GRAPH_TRACE records"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[2] == "decode" and cells[4] == "+16.50 [+13.10, +20.40]" and cells[5] == "+1.030 [+0.820, +1.280]"
    assert cells[6] == "-8176 / -8096"
