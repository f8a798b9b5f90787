"""The agent's HTTP side: /metrics over every attached process, /status with the process list.

Plugs into the export layer through its narrow interface ``create_app(snapshots=, capture=,
trace_lookup=, settings=, extra_status=, extra_collectors=)``: the export collector emits each
family once over every process's snapshot; the agent adds its process-health families.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from graphmon.export.agent import EMPTY_REASONS, Agent

PROCESS_INFO_LABELS = ["rank", "pid", "device", "host", "state"]
DEVICE_INFO_LABELS = ["rank", "device", "UUID", "pci_bus_id", "gpu_name", "host"]


def health_families(agent: Agent, device_info: bool = True) -> Iterable[Metric]:
    """The agent's process-health families (names agreed in interfaces.md). ``device_info=False``
    where the export layer's collector already emits graphmon_device_info from Snapshot.process."""
    atts = agent.attached()
    info = GaugeMetricFamily("graphmon_process_info", "One series per process attached to the agent.",
                             labels=PROCESS_INFO_LABELS)
    dev = GaugeMetricFamily("graphmon_device_info", "The physical GPU of each rank (join on UUID with DCGM).",
                            labels=DEVICE_INFO_LABELS)
    last = GaugeMetricFamily("graphmon_process_last_window_timestamp_seconds",
                             "Unix time of the last window the agent received from the process.", labels=["rank", "pid"])
    for a in atts:
        i = a.identity()
        info.add_metric([i["rank"], i["pid"], i["device"], i["host"], i["state"]], 1)
        dev.add_metric([i["rank"], i["device"], i["uuid"], i["pci_bus_id"], i["gpu_name"], i["host"]], 1)
        if a.proc.last_window_s is not None:
            last.add_metric([i["rank"], i["pid"]], a.proc.last_window_s)
    yield info
    if device_info:
        yield dev
    yield last
    empty = CounterMetricFamily("graphmon_empty_windows",
                                "no_records: a window saw graph launches and kept no record; no_windows: a process "
                                "that replays graphs sent no window within 3 intervals.", labels=["rank", "reason"])
    for reason in EMPTY_REASONS:
        for rank, n in sorted(agent.empty_total[reason].items()):
            empty.add_metric([rank, reason], n)
    yield empty
    lost = CounterMetricFamily("graphmon_processes_lost",
                               "Processes whose connection dropped or that stopped sending heartbeats.")
    lost.add_metric([], agent.lost_total)
    yield lost
    procs = GaugeMetricFamily("graphmon_processes", "Attached processes by state.", labels=["state"])
    for st, n in agent.state_counts().items():
        procs.add_metric([st], n)
    yield procs


class AgentHealthCollector:
    """The agent's own families (process list and health), beside the per-process snapshots."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterable[Metric]:
        # graphmon_device_info comes from each Snapshot.process (the export layer's collector)
        yield from health_families(self.agent, device_info=False)


def status(agent: Agent) -> dict:
    from graphmon.version import __version__

    procs = agent.process_status()
    return {"version": __version__, "mode": "agent", "socket": agent.socket_path,
            "up": any(p["state"] == "running" for p in procs), "processes": procs,
            "processes_by_state": agent.state_counts(), "processes_lost_total": agent.lost_total,
            "empty_windows_total": {r: dict(v) for r, v in agent.empty_total.items()},
            "link_rejected": dict(agent.listener.rejected), "errors_total": dict(agent.errors)}


def create_agent_app(agent: Agent):
    from graphmon.export.server import create_app

    app = create_app(snapshots=agent.snapshots, capture=agent.capture, trace_lookup=agent.trace_lookup,
                     settings=agent.settings, extra_status=lambda: status(agent), last_window=agent.last_window_id,
                     extra_collectors=[AgentHealthCollector(agent)])
    # every process's new snapshot re-renders /metrics off the request path
    agent.publish_hooks.append(lambda _snap: app.state.renderer.prerender())
    return app


def render_metrics(agent: Agent) -> bytes:
    """/metrics as the agent serves it (text format), rendered now: tests and diagnostics."""
    from graphmon.export.collector import make_registry
    from graphmon.export.exposition import render

    reg = make_registry(agent.snapshots, cardinality=agent.settings.cardinality,
                        extra=[AgentHealthCollector(agent)])
    return render(reg, "text")


def serve_background(agent: Agent, host: str, port: int, timeout_s: float = 10.0):
    """uvicorn in a daemon thread; returns (server, thread, bound_port) once it listens. The
    socket is bound here first, so a taken port is one clear error (not a uvicorn log line)."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = sock.getsockname()[1]
    app = create_agent_app(agent)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=bound, log_level="warning", access_log=False,
                                          lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="graphmon-agent-http", daemon=True)
    t.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not t.is_alive():
            raise RuntimeError(f"graphmon agent: HTTP server failed to start on {host}:{bound}")
        if time.monotonic() > deadline:
            raise RuntimeError("graphmon agent: HTTP server did not start in time")
        time.sleep(0.01)
    return server, t, bound
