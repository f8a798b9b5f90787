"""Exporter settings: flags and GRAPHMON_* environment variables (pydantic-settings)."""

from __future__ import annotations

import logging
import os
import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_rank() -> str:
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return os.environ[var]
    return "0"


def local_rank() -> int:
    for var in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


# What Kubernetes injects for a Service named "graphmon" in the pod's namespace (service links,
# on by default): GRAPHMON_PORT=tcp://10.0.0.1:9479. Never a port setting: ignored, with a warning.
SERVICE_LINK = re.compile(r"(tcp|udp|sctp)://[^\s/]+:\d+")
_warned_service_link = False


def _service_link_port(value):
    """GRAPHMON_PORT in the shape of a Kubernetes service link -> None (the default port)."""
    global _warned_service_link
    if isinstance(value, str) and SERVICE_LINK.fullmatch(value.strip()):
        if not _warned_service_link:
            _warned_service_link = True
            logging.getLogger("graphmon").warning(
                "GRAPHMON_PORT=%s is the variable Kubernetes injects for a Service named graphmon (service links), not "
                "a port: ignored, listening on the default port; set --port, or enableServiceLinks: false in the pod",
                value.strip())
        return None
    return value


class CuptiSettings(BaseSettings):
    """Every CUPTI sampling knob and its default (the one source: attach(), the CLI's help and flags,
    and CuptiSource read them here). Environment: GRAPHMON_<FIELD>, e.g. GRAPHMON_INTERVAL_S."""

    model_config = SettingsConfigDict(env_prefix="GRAPHMON_", extra="forbid")

    window_launches: int = Field(4, ge=1, description="graph launches per sampling window")
    window_duration_ms: float = Field(20.0, gt=0, description="longest a sampling window stays open")
    interval_s: float = Field(10.0, gt=0, description="seconds between CUPTI sampling windows, at least: a due "
                              "window opens on the next graph launch (with none for this long, an idle window, "
                              "nothing traced)")
    max_traced_share: float = Field(0.0005, gt=0, le=1, description="largest share of the time kernel tracing is on: "
                                    "after a window traced for T s the next waits T/share s (interval_s at least, "
                                    "max_interval_s at most; a window that traced no graph launch or got no record "
                                    "spends none). Traced steps run slower on the GPU (observer_slowdown); "
                                    "kept under one step in a thousand they stay out of the p99.9")
    max_interval_s: float = Field(60.0, gt=0, description="longest wait between windows that max_traced_share can ask for")
    first_window_s: float = Field(1.0, ge=0, description="seconds from attach to the first window")
    capture_max_duration_ms: float = Field(2000.0, gt=0, description="longest an on-demand capture window stays open")
    buffer_size_bytes: int = Field(1 << 20, ge=4096, description="bytes per CUPTI activity buffer (one decode per buffer)")
    max_buffers: int = Field(32, ge=2, description="activity buffers in the pool; a window closes early when they run out")
    max_window_records: int = Field(2_000_000, ge=1, description="kernel records kept per window; more are counted as dropped")
    max_window_launches: int = Field(65_536, ge=1, description="graph launches a capture window can hold (slots made before it opens)")
    drain_ms: float = Field(10.0, ge=0, description="fixed drain when no CUDA event tells when the window's launches ran")
    max_drain_ms: float = Field(250.0, ge=0, description="longest tracing stays on after a window closes, for its queued replays")
    observer: Literal["events", "off"] = Field("events", description="time replays with CUDA events to measure the observer effect")
    max_timed_launches: int = Field(256, ge=0, description="launches timed with CUDA events per phase")
    first_launch_wait_s: float = Field(5.0, ge=0, description="longest the launch callbacks stay on outside windows "
                                       "for a new graph's first launch (its upload mode); then it is 'unknown'")
    # Untraced bursts (sources/cupti/bursts.py): graph replays timed with CUDA events, kernel tracing
    # off, between windows. Defaults from the H200 costs per timed launch (docs/observer-effect.md):
    # GPU +2.3-2.6 us, host call +6.9 us [+6.3, +7.9], an HF host-bound step +28.7 us (+2.1%
    # [+1.2, +3.2] of 1.33 ms: at most ~43 us). 128 launches every 30 s at 43 us each is 5.5 ms
    # per 30 s: 0.018% of the time, on the GPU alone 0.33 ms (0.0011%). Arithmetic from those
    # per-launch costs, not yet measured as bursts on the H200 (bench/overhead/burst_cost.py).
    untraced_burst_launches: int = Field(128, ge=0, description="graph launches timed untraced per burst (CUDA events "
                                         "from the launch callback, kernel tracing off; at most max_timed_launches "
                                         "are timed); 0 turns bursts off")
    untraced_burst_interval_s: float = Field(30.0, gt=0, allow_inf_nan=False,
                                             description="seconds between untraced bursts, at least (never inside a "
                                             "kernel window; a window due waits for the burst to end)")
    untraced_burst_duration_ms: float = Field(1000.0, gt=0, allow_inf_nan=False,
                                              description="longest an untraced burst stays open (fewer launches "
                                              "come in it: it ends with those)")
    idle_unsubscribe_s: float = Field(0.0, ge=0, description="opt-in: between windows, unsubscribe from CUPTI once no "
                                      "graph has been instantiated for this long (until the next window; a torch graph "
                                      "capture subscribes again first), so that torch.profiler can run between windows. "
                                      "0 (default): stay subscribed. On the H200 the unsubscribe after a window stalled "
                                      "an HF decode step by 7.4 ms, while staying subscribed cost no measurable time")
    blocked_retry_s: float = Field(30.0, gt=0, description="seconds between subscribe attempts while another profiler holds CUPTI")
    poll_s: float = Field(0.05, gt=0, description="collector thread poll interval while the launch callbacks are on "
                          "outside windows (else it sleeps until the next window)")
    yield_ms: float = Field(0.5, ge=0, le=50, description="the collector thread sleeps at least this long between pieces "
                                                          "of its work (a buffer's decode), so that the host's threads get the GIL")
    gil_share: float = Field(0.2, gt=0, le=1, description="the collector thread's largest share of the GIL while it "
                                                          "works: after a piece of C ms it sleeps C*(1-share)/share "
                                                          "(a host thread that needs the GIL all the time slows by at "
                                                          "most this share, for the few ms a window's work takes)")
    keep_raw: bool = Field(False, description="diagnostics: keep each window's unfiltered records")
    launch_gate: bool = Field(True, description="never switch the launch callbacks off between a launch's enter and "
                                                "exit callbacks (off: the old behaviour, for A/B diagnostics only)")
    boundary: Literal["launch", "collector"] = Field(
        "launch", description="who switches kernel tracing at a window's edges. launch: the launch callbacks, on at "
                              "the window's first launch and off when its last launch returns, so a window traces "
                              "exactly its own launches, each whole; collector: the collector thread (then close "
                              "applies), for A/B diagnostics")
    close: Literal["drain_first", "disable_first"] = Field(
        "drain_first", description="boundary collector only. drain_first: trace until the window's replays ran; "
                                   "disable_first: stop tracing new launches at once (less traced, may cut the last "
                                   "replays)")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRAPHMON_", extra="forbid")

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(9479, ge=0, le=65535, description="HTTP port (an in-process attach() adds LOCAL_RANK)")
    token: Optional[str] = Field(None, repr=False,  # kept out of repr(): settings end up in logs and tracebacks
                                 description="bearer token for POST /capture, GET /trace and POST/DELETE /baseline "
                                             "(a command line is visible in ps: prefer the token file)")
    token_file: Optional[str] = Field(None, description="file holding the bearer token, e.g. a mounted Kubernetes "
                                      "Secret (read at start and on SIGHUP; surrounding whitespace is dropped)")
    web_config_file: Optional[str] = Field(None, description="web configuration file in the Prometheus exporter-toolkit "
                                           "format: TLS (tls_server_config) and basic auth (basic_auth_users, bcrypt "
                                           "hashes) for every endpoint but /healthz (docs/deployment.md)")
    protect_status: bool = Field(False, description="also require the token or a basic-auth user for /status, /graphs "
                                 "and GET /baseline (they show pids, host names, graph names and the configuration)")
    expect_processes: bool = Field(True, description="the agent expects a graph-replaying process to attach "
                                   "(graphmon_agent_expects_processes; GraphmonNoProcessAttached pages only then): "
                                   "false for a DaemonSet agent on nodes that may serve no engine")
    rank: str = Field(default_factory=_default_rank, description="the 'rank' label")
    max_graphs: int = Field(64, ge=1, description="series cap: graphs per device before folding into 'other'")
    max_streams: int = Field(16, ge=1, description="series cap: streams per graph before folding into 'other'")
    trace_store_count: int = Field(16, ge=0, description="windows kept for GET /trace/{id}")
    trace_store_bytes: int = Field(256 * 2**20, ge=0, description="bytes of windows kept for GET /trace/{id}")
    max_capture_replays: int = Field(10_000, ge=1, description="largest replays bound POST /capture accepts")
    max_capture_ms: float = Field(10_000.0, gt=0, allow_inf_nan=False,
                                  description="largest duration_ms POST /capture accepts")
    # Replay source (demo / recorded traces)
    window_interval_s: float = Field(1.0, gt=0, le=86_400, allow_inf_nan=False, description="seconds between windows")
    replays_per_window: int = Field(20, ge=1, description="replays per graph in one replayed window")
    # Series and HTTP limits (docs/reliability.md lists them with their defaults)
    max_devices: int = Field(16, ge=1, description="series cap: devices before folding into 'other'")
    max_label_length: int = Field(128, ge=16, le=4096, description="label values longer than this are cut (hash suffix)")
    stale_after_s: float = Field(600.0, gt=0, allow_inf_nan=False, description="drop series of graphs not sampled this long")
    cardinality: Literal["low", "standard", "full"] = Field(
        "standard", description="series per rank: standard = per-graph series for the detail graphs only (coarser "
        "histograms); full = every graph, every bucket and quantile; low = standard without histograms")
    detail_graphs: int = Field(2, ge=0, description="graphs per rank with series of their own at cardinality "
                               "standard and low: the ones the GPU spends most time in (others: /status, /graphs)")
    max_connections: int = Field(64, ge=1, description="open HTTP connections; more evict the oldest idle one")
    header_timeout_s: float = Field(10.0, gt=0, le=600, allow_inf_nan=False,
                                    description="a connection must send complete request headers within this")
    keep_alive_timeout_s: int = Field(5, ge=1, le=600, description="idle keep-alive connections are closed after this")
    max_trace_downloads: int = Field(4, ge=1, description="concurrent GET /trace downloads (more get 503)")
    trace_cache_bytes: int = Field(64 * 2**20, ge=0, description="rendered /trace bodies kept (shared by downloads)")
    state_dir: Optional[str] = Field(None, description="agent: keep the deploy verdict's references here, so that an "
                                                       "agent restart keeps them (a node path for the DaemonSet)")
    cupti: CuptiSettings = Field(default_factory=CuptiSettings, description="live CUPTI sampling")

    @field_validator("token", "token_file", "web_config_file")
    @classmethod
    def _empty_is_none(cls, v: Optional[str]) -> Optional[str]:
        return v or None

    @field_validator("port", mode="before")
    @classmethod
    def _not_a_service_link(cls, v):
        got = _service_link_port(v)
        return 9479 if got is None else got

    @model_validator(mode="after")
    def _read_token_file(self):
        if self.token_file is not None:
            if self.token is not None:
                raise ValueError("give the token once: GRAPHMON_TOKEN (--token) or GRAPHMON_TOKEN_FILE (--token-file)")
            self.token = read_token_file(self.token_file)
        return self

    def reload_token(self) -> bool:
        """Read token_file again (SIGHUP); True when the token changed. Raises ValueError."""
        if self.token_file is None:
            return False
        new = read_token_file(self.token_file)
        changed, self.token = new != self.token, new
        return changed

    @property
    def is_public(self) -> bool:
        return self.host not in ("127.0.0.1", "localhost", "::1")


def read_token_file(path: str) -> str:
    """The token in ``path`` (a Secret's file ends with a newline or not: whitespace is dropped).
    ValueError with the reason when it cannot be used."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(4097)
    except OSError as e:
        raise ValueError(f"cannot read token file {path}: {e.strerror or e}") from None
    if len(raw) > 4096:
        raise ValueError(f"token file {path} is over 4096 bytes: not a token")
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"token file {path} is not UTF-8 text") from None
    if not token:
        raise ValueError(f"token file {path} is empty")
    if any(c.isspace() for c in token):
        raise ValueError(f"token file {path} holds whitespace inside the token (a bearer token is one word)")
    return token
