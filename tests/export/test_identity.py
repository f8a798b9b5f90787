"""graphmon.export.identity: the engine's workload identity on every series of its rank, and a rank's
series taken over only by a process of the same workload (a DaemonSet agent serves several engines)."""

from __future__ import annotations

import re

import pytest

from graphmon.export.agent import Agent
from graphmon.export.agent_http import render_metrics
from graphmon.export.identity import workload_labels
from graphmon.settings import Settings
from helpers import AgentClient, wait_until


def pod(namespace, workload, template_hash, suffix, build=None):
    ident = {"namespace": namespace, "pod": f"{workload}-{template_hash}-{suffix}", "container": "engine",
             "workload": workload, "build": build or template_hash, "process_start_s": "1800000000.5"}
    return ident


@pytest.fixture
def agent():
    a = Agent(Settings(port=0, max_label_length=32), tick_s=0.02, heartbeat_lost_s=60).start()
    yield a
    a.stop()


def client(agent, rank="0", pid=None, **ident):
    c = AgentClient(agent.socket_path, rank=rank, pid=pid, hello=False)
    c.ident.update(ident)
    from graphmon.model.wire import encode_message

    c.s.sendall(encode_message("hello", identity=c.ident, status={"state": "running"}))
    return c


def _lines(text, prefix):
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


def test_every_series_of_a_rank_carries_its_pods_labels(agent):
    c = client(agent, pid=21, **pod("serving", "vllm", "7d9f8b6c4", "x2x9q"))
    c.window(8)
    assert wait_until(lambda: agent.snapshots() and agent.snapshots()[0].records_total == 8)
    text = render_metrics(agent).decode()
    want = ('build="7d9f8b6c4",container="engine",namespace="serving",pod="vllm-7d9f8b6c4-x2x9q",'
            'rank="0",workload="vllm"')
    for fam in ("graphmon_up{", "graphmon_records_total{", "graphmon_kernel_gap_seconds_count{",
                "graphmon_replay_gpu_seconds_count{", "graphmon_process_start_time_seconds{"):
        (line,) = [ln for ln in _lines(text, fam) if 'rank="0"' in ln]
        assert all(f'{kv}' in line for kv in want.split(",")), line
    assert _lines(text, "graphmon_process_start_time_seconds{")[0].endswith(" 1.8000000005e+09")
    # agent-level series name no pod of an engine
    assert all("pod=" not in ln for ln in _lines(text, "graphmon_agent_up"))
    c.close()


def test_a_long_label_value_is_cut_and_empty_ones_are_left_out(agent):
    long_pod = "a" * 80
    c = client(agent, pid=22, namespace="ns", pod=long_pod, container="", workload="", build="")
    c.window(8)
    assert wait_until(lambda: agent.snapshots() and agent.snapshots()[0].records_total == 8)
    (up,) = _lines(render_metrics(agent).decode(), "graphmon_up{")
    m = re.search(r'pod="([^"]*)"', up)
    assert m and len(m.group(1)) == 32 and m.group(1).startswith("a" * 23 + "~")
    assert "container=" not in up and "workload=" not in up and "build=" not in up and 'namespace="ns"' in up
    c.close()


def test_a_rank_is_taken_over_only_by_the_same_workload(agent):
    """Two engines on one node, each rank 0: a restart of one takes its own series over, never the other's."""
    a1 = client(agent, pid=1, **pod("ns", "alpha", "aaaa1", "p1"))
    assert wait_until(lambda: len(agent.processes) == 1)
    b1 = client(agent, pid=2, **pod("ns", "beta", "bbbb1", "q1"))
    assert wait_until(lambda: len(agent.processes) == 2)
    ranks = {a.proc.identity["workload"]: a.rank for a in agent.attached()}
    assert ranks == {"alpha": "0", "beta": "0@2"}
    a1.bye()
    a1.close()
    assert wait_until(lambda: any(x.gone_s for x in agent.attached()))
    b2 = client(agent, pid=3, **pod("ns", "beta", "bbbb2", "q2"))  # beta's new build: not alpha's rank 0
    assert wait_until(lambda: any(x.proc.identity.get("pid") == "3" for x in agent.attached()))
    live = {a.proc.identity["pod"]: a.rank for a in agent.attached() if a.gone_s is None}
    assert live == {"beta-bbbb1-q1": "0@2", "beta-bbbb2-q2": "0@3"}
    a2 = client(agent, pid=4, **pod("ns", "alpha", "aaaa2", "p2"))  # alpha's new pod takes alpha's series over
    assert wait_until(lambda: any(x.proc.identity.get("pid") == "4" for x in agent.attached()))
    assert {a.proc.identity["pod"]: a.rank for a in agent.attached() if a.gone_s is None}["alpha-aaaa2-p2"] == "0"
    for c in (b1, b2, a2):
        c.close()


def test_workload_labels():
    assert workload_labels({"namespace": "n", "pod": "", "build": "b", "pid": "7"}) == {"namespace": "n", "build": "b"}
    assert workload_labels({"pod": "x" * 40}, 20) == {"pod": workload_labels({"pod": "x" * 40}, 20)["pod"]}
    assert len(workload_labels({"pod": "x" * 40}, 20)["pod"]) == 20
