"""``graphmon run`` / ``record`` / ``agent``: the agent process and the hook folder for children.

``graphmon run -- CMD``: this process becomes the agent (socket + HTTP on one port), starts CMD
with the hook folder first on PYTHONPATH and ``GRAPHMON_AGENT`` set, supervises it (signals are
forwarded, its exit code returned) and removes the hook folder and socket on exit.

The hook folder holds only: ``sitecustomize.py`` (a link to graphmon/host/sitecustomize.py) and
``graphmon`` (a link to this package). What the collector needs beyond the stdlib (numpy,
cupti-python and its dependencies) is linked into ``fallback/``, which the hook appends at the
END of sys.path: the engine's own packages always win, graphmon's fill only what is missing.
Never a whole site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional, Sequence

from graphmon.host.attach import AGENT_ENV, ATTACH_ENV, Recorder, source_keys

HOOK_FALLBACK_ENV = "GRAPHMON_HOOK_FALLBACK"
COLLECTOR_DISTS = ("numpy", "pydantic-settings", "cupti-python")  # what the light collector imports beyond the stdlib
AGENT_KEYS = ("host", "port", "token", "max_graphs", "max_streams", "trace_store_count", "trace_store_bytes")


def _dist_links(dist_name: str, seen: set) -> dict[str, str]:
    """Top-level import names (and dist-info) of a distribution and its requirements ->
    their paths in graphmon's environment."""
    from importlib import metadata

    out: dict[str, str] = {}
    key = dist_name.lower().replace("_", "-")
    if key in seen:
        return out
    seen.add(key)
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return out
    for f in dist.files or ():
        top = f.parts[0] if f.parts else ""
        if not top or top in ("..", "bin", "__pycache__") or top.endswith(".pth"):
            continue
        path = os.path.normpath(str(dist.locate_file(top)))
        if os.path.exists(path) and not top.startswith("__editable__"):
            out[top] = path
    for req in dist.requires or ():
        if "extra ==" in req:
            continue
        name = req.split(";")[0].strip()
        for sep in "<>=!~[ (":
            name = name.split(sep)[0]
        if name:
            out.update(_dist_links(name, seen))
    return out


class HookDir:
    """The folder a child's PYTHONPATH gains; removed by :meth:`cleanup`."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="graphmon-hook-")
        here = os.path.dirname(os.path.abspath(__file__))
        os.symlink(os.path.join(here, "sitecustomize.py"), os.path.join(self.path, "sitecustomize.py"))
        os.symlink(os.path.dirname(here), os.path.join(self.path, "graphmon"))
        self.fallback = os.path.join(self.path, "fallback")
        os.mkdir(self.fallback)
        seen: set = set()
        for dist in COLLECTOR_DISTS:
            for top, src in _dist_links(dist, seen).items():
                dst = os.path.join(self.fallback, top)
                if not os.path.lexists(dst):
                    os.symlink(src, dst)

    def env(self, agent_socket: str, source_kwargs: dict, env: Optional[dict] = None) -> dict:
        env = dict(os.environ if env is None else env)
        parts = [self.path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        env[HOOK_FALLBACK_ENV] = self.fallback
        env[AGENT_ENV] = agent_socket
        env[ATTACH_ENV] = json.dumps({k: v for k, v in source_kwargs.items() if k in source_keys()})
        return env

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)  # removes the links, never what they point to


def cupti_problem() -> Optional[str]:
    """Why the hook's collector could not import cupti-python, or None.

    The hook takes what the engine lacks from graphmon's own environment (``fallback/``, built from
    COLLECTOR_DISTS), so cupti must be importable here. find_spec looks without importing (no CUDA
    needed). The API seam (tests, simulators) replaces cupti-python altogether."""
    import importlib.util

    from graphmon.sources.cupti.api import API_ENV

    if os.environ.get(API_ENV) or importlib.util.find_spec("cupti") is not None:
        return None
    return "cupti-python is not importable in graphmon's environment: pip install 'graphmon[cupti]'"


def _split(settings: Optional[dict]) -> tuple[dict, dict]:
    s = dict(settings or {})
    return {k: s[k] for k in AGENT_KEYS if k in s}, {k: v for k, v in s.items() if k in source_keys()}


class AgentStartError(RuntimeError):
    """The agent could not start (port taken, socket path unusable): one line for the user."""


def start_agent(agent_kwargs: dict, recorder_factory=None, socket_path: Optional[str] = None, serve: bool = True,
                peers=None):
    """Agent + HTTP. Returns (agent, http_server_or_None, bound_port); AgentStartError if it cannot.
    ``peers``: the PeerPolicy of who may connect (default: this uid)."""
    from graphmon.export.agent import Agent
    from graphmon.settings import Settings

    try:
        agent = Agent(Settings(**agent_kwargs), socket_path=socket_path, recorder_factory=recorder_factory,
                      peers=peers).start()
    except OSError as e:
        raise AgentStartError(f"agent socket {socket_path or ''}: {e.strerror or e}") from None
    if not serve:
        return agent, None, None
    from graphmon.export.agent_http import serve_background

    try:
        server, _, port = serve_background(agent, agent.settings.host, agent.settings.port)
    except Exception as e:
        agent.stop()
        raise AgentStartError(f"{e} (choose another port with --port)") from None
    return agent, server, port


def run_command(argv: Sequence[str], settings: Optional[dict] = None, *, recorder_factory=None,
                serve: bool = True, ready=None) -> int:
    """Run ``argv`` under an agent; returns its exit code (2: no command, 127: not found)."""
    argv = list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("graphmon run: no command given (usage: graphmon run -- python serve.py ...)", file=sys.stderr)
        return 2
    agent_kw, source_kw = _split(settings)
    agent, server, port = start_agent(agent_kw, recorder_factory=recorder_factory, serve=serve)
    hook = HookDir()
    try:
        if server is not None:
            print(f"graphmon: agent serving http://{agent.settings.host}:{port}/metrics for the processes of "
                  f"{argv[0]} (socket {agent.socket_path})", file=sys.stderr, flush=True)
        if ready is not None:
            ready(agent, port)
        try:
            proc = subprocess.Popen(argv, env=hook.env(agent.socket_path, source_kw))
        except FileNotFoundError:
            print(f"graphmon run: command not found: {argv[0]}", file=sys.stderr)
            return 127
        return _supervise(proc)
    finally:
        hook.cleanup()
        if server is not None:
            server.should_exit = True
        agent.stop()


def _supervise(proc: subprocess.Popen) -> int:
    old = {}

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except Exception:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread
            pass
    try:
        return proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def rank_path(path: str, rank: str) -> str:
    """``rec.graphmon.npz`` -> ``rec.rank1.graphmon.npz``."""
    for suffix in (".graphmon.npz", ".npz"):
        if path.endswith(suffix):
            return f"{path[: -len(suffix)]}.rank{rank}{suffix}"
    return f"{path}.rank{rank}"


def record_command(argv: Sequence[str], output: str, windows: int = 0, settings: Optional[dict] = None) -> int:
    """``graphmon record -o FILE --windows N -- cmd``: the agent keeps each process's windows and
    saves them (one file per rank when there are several) when N windows came or at exit."""
    output = os.path.abspath(output)
    recorders: list[Recorder] = []

    def factory(ident: dict) -> Recorder:
        # one process without a launcher-given rank: the file named; else one file per rank.
        # The agent tells a process to stop sampling once its recorder has N windows.
        ranked = ident.get("rank_source", "pid") != "pid" or recorders
        rec = Recorder(rank_path(output, ident.get("rank", "")) if ranked else output, windows)
        recorders.append(rec)
        return rec

    try:
        return run_command(argv, settings, recorder_factory=factory, serve=False)
    finally:
        for rec in recorders:
            path = rec.save()
            if path:
                print(f"graphmon: recorded {len(rec.traces)} windows to {path}", file=sys.stderr)


def agent_command(settings: Optional[dict] = None, socket_path: Optional[str] = None, peers=None) -> int:
    """``graphmon agent``: serve until SIGTERM/SIGINT (a sidecar or DaemonSet). An explicit
    ``socket_path``'s directory must exist (a shared volume): nothing but the socket is written."""
    agent_kw, _ = _split(settings)
    agent, server, port = start_agent(agent_kw, socket_path=socket_path, peers=peers)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the line that says it is ready
        signal.signal(sig, lambda *_: done.set())
    print(f"graphmon: agent serving http://{agent.settings.host}:{port}/metrics; processes attach with "
          f"{AGENT_ENV}={agent.socket_path} (allowed: {agent.listener.peers.describe()})", file=sys.stderr, flush=True)
    try:
        done.wait()
    finally:
        server.should_exit = True
        agent.stop()
    return 0
