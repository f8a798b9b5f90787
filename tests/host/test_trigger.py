"""The graph trigger (first CUDAGraph.capture_begin subscribes) and the vLLM plugin entry point,
in child processes with the fake torch and the fake CUPTI."""

import os
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from graphmon.report.summary import snapshot_graphs
from graphmon.export.agent import Agent
from graphmon.settings import Settings

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


@pytest.fixture
def agent():
    a = Agent(Settings(port=0), tick_s=0.05).start()
    yield a
    a.stop()


def _child(code, agent=None, extra_path=(), **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, extra_path), str(ROOT), str(TESTS), str(TESTS / "fake_site")]), GRAPHMON_CUPTI_API="cupti:cupti",
             GRAPHMON_ATTACH_JSON='{"interval_s": 0.05, "first_window_s": 0.0, "window_launches": 4, "max_traced_share": 1.0}', **env)
    e.pop("GRAPHMON_AGENT", None)
    if agent is not None:
        e["GRAPHMON_AGENT"] = agent.socket_path
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


TRIGGER = """
    import sys, time
    from graphmon.host import trigger
    from graphmon.host.attach import attach_from_env, attached
    from graphmon.sources.cupti import capture_hook
    trigger.install(attach_from_env)
    import torch
    cls = torch.cuda.CUDAGraph
    print("patched", "capture_begin" in cls.__dict__ and cls.capture_begin.__qualname__.endswith("capture_begin")
          and hasattr(cls.__dict__["capture_begin"], "__graphmon_wrapped__") and capture_hook.installed())
    print("cupti_before", "cupti" in sys.modules, attached() is not None)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    print("cupti_after", "cupti" in sys.modules, attached() is not None)
    print("restored", not capture_hook.installed() and not hasattr(cls.__dict__.get("capture_begin"), "__graphmon_wrapped__"))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3 and attached().light.link.stats["windows_sent"] < 2:
        g.replay(); time.sleep(0.002)
    print("sent", attached().light.link.stats["windows_sent"] >= 2)
"""


def test_first_capture_subscribes_and_torch_loads_first(agent):
    out = _child(TRIGGER, agent)
    assert out[0] == "patched True"
    # nothing CUPTI-related before the first capture: torch's libcupti is the one in the process
    assert out[1] == "cupti_before False False"
    assert out[2] == "cupti_after True True"
    assert out[3] == "restored True"
    assert out[4] == "sent True"
    assert any(s.records_total > 0 for s in agent.snapshots())
    # the graph was instantiated under the subscription: its upload mode is known
    a = agent.attached()[0]
    assert {g["upload_mode"] for g in snapshot_graphs(a.aggregator.snapshot())} == {"lazy"}


def test_trigger_installed_after_torch_import_still_fires(agent):
    out = _child("""
        import torch
        from graphmon.host import trigger
        from graphmon.host.attach import attach_from_env, attached
        trigger.install(attach_from_env)
        g = torch.cuda.CUDAGraph(); g.capture_begin(); g.capture_end()
        print(attached() is not None)
    """, agent)
    assert out == ["True"]


def test_process_without_graphs_never_subscribes(agent):
    out = _child("""
        import sys
        from graphmon.host import trigger
        from graphmon.host.attach import attach_from_env, attached
        trigger.install(attach_from_env)
        import torch
        torch.cuda.set_device(0)
        print("cupti" in sys.modules, attached() is None)
    """, agent)
    assert out == ["False True"]
    time.sleep(0.3)
    assert not agent.processes


def _fake_dist(tmp_path):
    """A dist-info carrying pyproject's vllm.general_plugins entry points (what pip would write)."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    d = tmp_path / "graphmon_plugin_standin-0.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: graphmon-plugin-standin\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text("[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return tmp_path


VLLM_STANDIN = """
    # what vllm.plugins.load_general_plugins does in each process it creates
    import sys
    from importlib.metadata import entry_points
    # vLLM keys plugins by name (graphmon's own install and the stand-in dist-info may both list it)
    plugins = {ep.name: ep for ep in entry_points(group="vllm.general_plugins")}
    assert plugins["graphmon"].value == "graphmon.host.vllm_plugin:register", plugins
    plugins["graphmon"].load()()
    import torch
    from graphmon.host.attach import attached
    print("before", attached() is None)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    print("after", attached() is not None)
"""


def test_vllm_general_plugin_attaches_through_entry_points(agent, tmp_path):
    out = _child(VLLM_STANDIN, agent, extra_path=[_fake_dist(tmp_path)])
    assert out == ["before True", "after True"]
    t0 = time.monotonic()
    while not agent.processes and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    assert agent.processes


def test_vllm_plugin_without_agent_does_nothing(tmp_path):
    out = _child(VLLM_STANDIN, None, extra_path=[_fake_dist(tmp_path)])
    assert out == ["before True", "after False"]
