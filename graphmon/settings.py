"""Exporter settings: flags and GRAPHMON_* environment variables (pydantic-settings)."""

from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import Field, field_validator
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
    close: Literal["drain_first", "disable_first"] = Field(
        "drain_first", description="drain_first: trace until the window's replays ran; disable_first: stop tracing new "
                                   "launches at once (less traced, may cut the last replays)")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRAPHMON_", extra="forbid")

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(9479, ge=0, le=65535, description="base port; attach() adds LOCAL_RANK")
    token: Optional[str] = Field(None, repr=False,  # kept out of repr(): settings end up in logs and tracebacks
                                 description="bearer token required by POST /capture")
    rank: str = Field(default_factory=_default_rank, description="the 'rank' label")
    max_graphs: int = Field(64, ge=1, description="series cap: graphs per device before folding into 'other'")
    max_streams: int = Field(16, ge=1, description="series cap: streams per graph before folding into 'other'")
    trace_store_count: int = Field(16, ge=0, description="windows kept for GET /trace/{id}")
    trace_store_bytes: int = Field(256 * 2**20, ge=0, description="bytes of windows kept for GET /trace/{id}")
    max_capture_replays: int = Field(10_000, ge=1)
    max_capture_ms: float = Field(10_000.0, gt=0, allow_inf_nan=False)
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
    cupti: CuptiSettings = Field(default_factory=CuptiSettings, description="live CUPTI sampling")

    @field_validator("token")
    @classmethod
    def _empty_token_is_none(cls, v: Optional[str]) -> Optional[str]:
        return v or None

    @property
    def is_public(self) -> bool:
        return self.host not in ("127.0.0.1", "localhost", "::1")
