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

import gc
import json
import logging
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
log = logging.getLogger("graphmon")


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
    from graphmon.buildinfo import install_hint

    return f"cupti-python is not importable in graphmon's environment: {install_hint('cupti')}"


def _split(settings: Optional[dict]) -> tuple[dict, dict]:
    """(the agent's Settings fields, the processes' CUPTI settings) of run/record/agent's flags."""
    from graphmon.settings import Settings

    s = dict(settings or {})
    agent_keys = set(Settings.model_fields) - {"cupti"}
    return {k: v for k, v in s.items() if k in agent_keys}, {k: v for k, v in s.items() if k in source_keys()}


AGENT_SWITCH_INTERVAL_S = 0.001
AGENT_FULL_GC_EVERY = 100  # middle-generation collections per full one (CPython's default: 10)


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

    # The agent's process runs no GPU work, only graphmon's threads: hand the GIL over every 1 ms
    # (not 5), so a scrape waits at most that long at each step for the ingest and render threads.
    sys.setswitchinterval(AGENT_SWITCH_INTERVAL_S)
    try:
        server, _, port = serve_background(agent, agent.settings.host, agent.settings.port)
    except Exception as e:
        agent.stop()
        raise AgentStartError(f"{e} (choose another port with --port)") from None
    _first_scrape(agent.settings.host, port)
    # What is loaded by now (modules, the app, what the first scrape made) lives as long as the
    # process: out of the cyclic GC's scans, which hold the GIL (a full collection of the agent at
    # 64 ranks took 45-110 ms with them, 18-28 ms without, on a loaded 2-core machine).
    gc.freeze()
    # And full collections 10x rarer (every 100 middle ones, not 10): the agent's garbage is freed
    # by reference counting; what a full collection finds (cycles) waits a little longer.
    g0, g1, _ = gc.get_threshold()
    gc.set_threshold(g0, g1, AGENT_FULL_GC_EVERY)
    return agent, server, port


def _first_scrape(host: str, port: int) -> None:
    """GET /metrics once, as Prometheus asks: the imports and caches of a first scrape (20 ms on
    a 2-core machine) are made now, not in Prometheus's first scrape."""
    import http.client

    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1" if host != "::" else "::1"
    try:
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0",
                                              "Accept-Encoding": "gzip"})
        c.getresponse().read()
        c.close()
    except (OSError, http.client.HTTPException):
        pass  # a warm-up only (a TLS or basic-auth web config answers otherwise: nothing to warm)


def run_command(argv: Sequence[str], settings: Optional[dict] = None, *, recorder_factory=None,
                serve: bool = True, ready=None, before_stop=None) -> int:
    """Run ``argv`` under an agent; returns its exit code (2: no command, 127: not found).
    ``before_stop(agent)``: called once the command has exited, before the agent stops."""
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
            log.info("agent serving %s://%s:%d/metrics for the processes of %s (socket %s)", _scheme(server),
                     agent.settings.host, port, argv[0], agent.socket_path)
        if ready is not None:
            ready(agent, port)
        try:
            proc = subprocess.Popen(argv, env=hook.env(agent.socket_path, source_kw))
        except FileNotFoundError:
            print(f"graphmon run: command not found: {argv[0]}", file=sys.stderr)
            return 127
        return _supervise(proc, server)
    finally:
        hook.cleanup()
        if server is not None:
            server.should_exit = True
        try:
            if before_stop is not None:
                before_stop(agent)
        finally:
            agent.stop()


def _scheme(server) -> str:
    web = getattr(server, "graphmon_web", None)
    return "https" if web is not None and web.tls is not None else "http"


def _reload(server) -> None:
    """SIGHUP: the token file and web config are read again (graphmon.export.webconfig)."""
    web = getattr(server, "graphmon_web", None)
    if web is not None:
        web.reload_and_log()
    else:
        log.info("SIGHUP: nothing to reload (no HTTP server); graphmon keeps running")


def _supervise(proc: subprocess.Popen, server=None) -> int:
    """Wait for the command; SIGINT and SIGTERM are forwarded to it, SIGHUP too (a supervisor's
    reload request is the command's), and the agent reloads its token file and web config."""
    old = {}

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except Exception:
            pass
        if signum == signal.SIGHUP:
            _reload(server)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
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


# graphmon record's own exit codes, when the command itself exited 0 (its code wins otherwise)
EXIT_NOTHING_RECORDED = 3  # no process attached, or none sent a window: no file written
EXIT_FEWER_WINDOWS = 4  # a file was written, with fewer windows than --windows asked for


def record_command(argv: Sequence[str], output: str, windows: int = 0, settings: Optional[dict] = None) -> int:
    """``graphmon record -o FILE --windows N -- cmd``: the agent keeps each process's windows and
    saves them (one file per rank when there are several) when N windows came or at exit.

    Never a silent success: when nothing was recorded (exit 3) or a process sent fewer than N
    windows (exit 4) it says so, with each attached process's state and reason."""
    output = os.path.abspath(output)
    recorders: list[Recorder] = []
    states = _StateLog()  # what each attached process reported: sampled while it runs, and at the end

    def factory(ident: dict) -> Recorder:
        # one process without a launcher-given rank: the file named; else one file per rank.
        # The agent tells a process to stop sampling once its recorder has N windows.
        # (the device ordinal or the default rank is no launcher-given rank)
        ranked = ident.get("rank_source", "default") not in ("pid", "default", "cuda_device") or recorders
        rec = Recorder(rank_path(output, ident.get("rank", "")) if ranked else output, windows)
        rec.who = _who(ident)
        recorders.append(rec)
        return rec

    try:
        rc = run_command(argv, settings, recorder_factory=factory, serve=False,
                         ready=lambda agent, port: states.follow(agent), before_stop=states.finish)
    except BaseException:  # interrupted, or the agent could not start: keep what came, then re-raise
        states.finish(None)
        for rec in recorders:
            rec.save()
        raise
    code = _report_recording(recorders, states.result(), windows, argv)
    return code if rc == 0 and code else rc


def _who(ident: dict) -> str:
    rank, pid = str(ident.get("rank", "")), str(ident.get("pid", ""))
    if rank:
        return f"rank {rank} (pid {pid})" if pid else f"rank {rank}"
    return f"pid {pid}" if pid else "a process"


class _StateLog:
    """Each attached process's state and reason for the final report. A process that failed and
    then exited reports "stopped" last, so the last state that said something (not running,
    starting or stopped, or any with a reason) is kept over the final one. Sampled every
    SAMPLE_S on a thread of its own, ended by :meth:`finish`."""

    SAMPLE_S = 0.25
    QUIET = ("running", "starting", "stopped")

    def __init__(self) -> None:
        self._by: dict[str, dict] = {}
        self._done = threading.Event()

    def follow(self, agent) -> None:
        def loop() -> None:
            while not self._done.wait(self.SAMPLE_S):
                self.sample(agent)

        threading.Thread(target=loop, name="graphmon-record-states", daemon=True).start()

    def sample(self, agent) -> None:
        for a in agent.attached():
            try:
                h = a.health()
                who = _who(a.identity())
                now = {"who": who, "state": h.state, "reason": h.reason, "errors": dict(h.errors)}
            except Exception as e:  # noqa: BLE001 - a report line, never a crash at exit
                now = {"who": "a process", "state": "unknown", "reason": repr(e), "errors": {}}
            old = self._by.get(now["who"])
            telling = now["state"] not in self.QUIET or now["reason"].strip()
            if old is None or telling or not (old["state"] not in self.QUIET or old["reason"].strip()):
                self._by[now["who"]] = now
            else:  # keep the telling state, with the newest error counts
                old["errors"] = now["errors"]

    def finish(self, agent) -> None:
        self._done.set()
        if agent is not None:
            self.sample(agent)

    def result(self) -> list[dict]:
        return list(self._by.values())


def describe_reason(state: str, reason: str, errors: dict) -> str:
    """``state: reason``, never with an empty reason: a reason that is empty or ends in ':' (an
    exception without a message) says so and names the stages that counted errors. A running,
    starting or stopped process without a reason is just its state."""
    reason = " ".join((reason or "").split())
    if not reason and state in _StateLog.QUIET:
        return state  # nothing to explain
    if not reason or reason.endswith(":"):
        stages = ", ".join(f"{k}={v}" for k, v in sorted(errors.items()) if v) or "none counted"
        reason = (reason.rstrip(": ") + " " if reason else "") + f"(no detail reported; errors: {stages})"
    return f"{state}: {reason}"


def _report_recording(recorders: list[Recorder], processes: list[dict], windows: int, argv: Sequence[str]) -> int:
    """Save what came, print one line per outcome, return 0, EXIT_NOTHING_RECORDED or EXIT_FEWER_WINDOWS."""
    err = lambda msg: print(f"graphmon record: {msg}", file=sys.stderr)  # noqa: E731
    saved, short = 0, []
    for rec in recorders:
        path = rec.save()
        n = len(rec.traces)
        if path:
            saved += 1
            print(f"graphmon: recorded {n} window{'s' if n != 1 else ''} to {path}", file=sys.stderr)
        if windows and n < windows:
            short.append((rec, n))
    states = "; ".join(f"{p['who']}: {describe_reason(p['state'], p['reason'], p['errors'])}" for p in processes)
    if not recorders:
        err(f"nothing recorded: no process of {os.path.basename(argv[0]) if argv else 'the command'} attached "
            "(none captured a CUDA graph under torch; for graphs captured otherwise set GRAPHMON_SUBSCRIBE=start)")
        return EXIT_NOTHING_RECORDED
    if not saved:
        err(f"nothing recorded: {len(recorders)} process{'es' if len(recorders) != 1 else ''} attached and sent no "
            f"window ({states or 'no state reported'})")
        return EXIT_NOTHING_RECORDED
    for rec, n in short:
        mine = [describe_reason(p["state"], p["reason"], p["errors"]) for p in processes if p["who"] == rec.who]
        err(f"{rec.who or 'a process'}: recorded {n} of {windows} windows" + (f" to {rec.path}" if n else "")
            + " (it exited or stopped sampling first" + (f"; last state {mine[0]}" if mine else "") + ")")
    return EXIT_FEWER_WINDOWS if short else 0


def agent_command(settings: Optional[dict] = None, socket_path: Optional[str] = None, peers=None) -> int:
    """``graphmon agent``: serve until SIGTERM/SIGINT (a sidecar or DaemonSet). An explicit
    ``socket_path``'s directory must exist (a shared volume): nothing but the socket is written."""
    agent_kw, _ = _split(settings)
    agent, server, port = start_agent(agent_kw, socket_path=socket_path, peers=peers)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the line that says it is ready
        signal.signal(sig, lambda *_: done.set())
    # SIGHUP (a terminal gone, a supervisor's reload) would end the agent and leave its socket:
    # it reloads the token file and web config instead.
    signal.signal(signal.SIGHUP, lambda *_: _reload(server))
    log.info("agent serving %s://%s:%d/metrics; processes attach with %s=%s (allowed: %s)", _scheme(server),
             agent.settings.host, port, AGENT_ENV, agent.socket_path, agent.listener.peers.describe())
    try:
        done.wait()
    finally:
        server.should_exit = True
        agent.stop()
    return 0
