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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRAPHMON_", extra="forbid")

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(9464, ge=0, le=65535, description="base port; attach() adds LOCAL_RANK")
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
    cardinality: Literal["full", "low"] = Field("full", description="low: no histogram buckets (summaries stay)")
    max_connections: int = Field(64, ge=1, description="open HTTP connections; more evict the oldest idle one")
    header_timeout_s: float = Field(10.0, gt=0, le=600, allow_inf_nan=False,
                                    description="a connection must send complete request headers within this")
    keep_alive_timeout_s: int = Field(5, ge=1, le=600, description="idle keep-alive connections are closed after this")
    max_trace_downloads: int = Field(4, ge=1, description="concurrent GET /trace downloads (more get 503)")
    trace_cache_bytes: int = Field(64 * 2**20, ge=0, description="rendered /trace bodies kept (shared by downloads)")

    @field_validator("token")
    @classmethod
    def _empty_token_is_none(cls, v: Optional[str]) -> Optional[str]:
        return v or None

    @property
    def is_public(self) -> bool:
        return self.host not in ("127.0.0.1", "localhost", "::1")
