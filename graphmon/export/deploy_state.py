"""The deploy verdict's pools on disk (``--state-dir``): a restarted agent keeps every rank's reference.

Without it a rank's reference (the previous process's pool, graphmon.export.deploy) lives as long
as the agent: a DaemonSet agent that is upgraded, or evicted and started again, would compare the
next deploy with nothing. With a state directory (the DaemonSet mounts a node path) the verdict
writes each rank's pools there and reads them back at start.

Files: one per (rank, role), ``<sha1(rank)[:16]>.<role>.npz`` with role ``current`` (the newest
process's pool, written at most every ``save_interval_s`` per rank and at the agent's stop) or
``previous`` (the reference, written when a new process takes the rank over). Each is an npz of
``state_json`` (rank, role, the process it came from, the windows' ids and end times) and one
``w<i>`` per window: that window in graphmon's native trace format (graphmon.formats.native) with
its untraced replay durations, read back through the native reader with its validation and
limits; the pool's carry (the untraced durations of windows it dropped) is ``carry_ns``, its graph
keys and counts in ``state_json``'s ``untraced_carry``. A file written before untraced durations
existed has neither: its windows read back with none. Why npz in npz and not one
concatenated trace: :func:`graphmon.model.trace.concat` re-resolves graphs and can drop duplicate
records, so the windows could not be cut apart again; the pool's bounds work per window. Written
to a temporary name and renamed: a crash leaves the old file or the new one, never half of one.

A file that cannot be read (truncated, corrupt, another version, written by something else) is
logged, counted (``errors["load"]``), moved aside as ``<name>.corrupt`` and ignored: that rank
starts afresh. A write that fails (disk full, read-only) is logged and counted (``errors["save"]``)
and retried at the next save; the verdict itself never depends on the disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
import zipfile
from dataclasses import dataclass
from typing import Optional

import numpy as np

from graphmon.analysis.deploy import UNTRACED_SAMPLES
from graphmon.export.deploy_pool import Pool, pooled
from graphmon.formats.common import ReadLimits
from graphmon.formats.native import read_native, read_native_untraced, write_trace_to
from graphmon.model.trace import TraceError

log = logging.getLogger("graphmon.agent")
ROLES = ("current", "previous")
STATE_ERRORS = ("load", "save")
FORMAT = "graphmon-deploy-state"
VERSION = 1
SAVE_INTERVAL_S = 60.0
# A pool holds at most 32 MiB of columns (deploy_pool.MAX_BYTES); a state file is refused beyond
# this many bytes of windows, so a file written by something else cannot exhaust the agent.
MAX_FILE_BYTES = 256 * 2**20


@dataclass
class SavedRank:
    """One rank as read back: its newest process's pool and its reference."""

    rank: str
    process: str  # graphmon.export.deploy's process key of the current pool ("" unknown)
    current: Optional[Pool]
    previous: Optional[Pool]
    previous_process: str = ""


class StateDir:
    """Reads and writes the verdict's pools under one directory (see the module docs)."""

    def __init__(self, path: str, *, save_interval_s: float = SAVE_INTERVAL_S) -> None:
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise OSError(f"state directory {self.path} is not writable")
        self.save_interval_s = float(save_interval_s)
        self.errors = dict.fromkeys(STATE_ERRORS, 0)
        self._saved_at: dict[str, float] = {}  # rank -> monotonic time its current pool was written

    def file(self, rank: str, role: str) -> str:
        digest = hashlib.sha1(rank.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return os.path.join(self.path, f"{digest}.{role}.npz")

    # ------------------------------------------------------------------ write (the verdict's thread)
    def due(self, rank: str) -> bool:
        t = self._saved_at.get(rank)
        return t is None or time.monotonic() - t >= self.save_interval_s

    def save(self, rank: str, role: str, pool: Optional[Pool], process: str) -> bool:
        """Write (or, for no pool, remove) one rank's pool; False (logged, counted) when it failed."""
        path = self.file(rank, role)
        if role == "current":
            self._saved_at[rank] = time.monotonic()
        try:
            if pool is None or not pool.windows:
                _remove(path)
                return True
            arrays = {"state_json": _json_bytes({
                "format": FORMAT, "version": VERSION, "rank": rank, "role": role, "process": process,
                "max_replays": pool.max_replays, "max_bytes": pool.max_bytes,
                "windows": [[w.window_id, w.ended_s] for w in pool.windows],
                "untraced_carry": [[k, len(d)] for k, d in pool.carry.items()]})}
            for i, w in enumerate(pool.windows):
                buf = io.BytesIO()
                write_trace_to(w.trace, buf, w.untraced)
                arrays[f"w{i}"] = np.frombuffer(buf.getbuffer(), dtype=np.uint8)
            if pool.carry:
                arrays["carry_ns"] = np.concatenate(list(pool.carry.values())).astype(np.int64)
            tmp = f"{path}.tmp"
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)  # the windows are compressed already
            os.replace(tmp, path)
            return True
        except Exception as e:  # contained: the verdict goes on without its state on disk
            self.errors["save"] += 1
            log.warning("graphmon deploy state: cannot write %s: %r", path, e)
            return False

    def forget(self, rank: str) -> None:
        self._saved_at.pop(rank, None)
        for role in ROLES:
            _remove(self.file(rank, role))

    # ------------------------------------------------------------------ read (the agent's start)
    def load(self) -> list[SavedRank]:
        """Every rank the directory holds; unreadable files are moved aside and counted."""
        ranks: dict[str, SavedRank] = {}
        for name in sorted(os.listdir(self.path)):
            role = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
            if not name.endswith(".npz") or role not in ROLES:
                continue
            path = os.path.join(self.path, name)
            try:
                rank, process, pool = self._read(path, role)
            except Exception as e:
                self.errors["load"] += 1
                log.warning("graphmon deploy state: ignoring %s (%s); that rank starts without a reference",
                            path, _why(e))
                try:
                    os.replace(path, f"{path}.corrupt")
                except OSError:
                    pass
                continue
            s = ranks.setdefault(rank, SavedRank(rank, "", None, None))
            if role == "current":
                s.current, s.process = pool, process
            else:
                s.previous, s.previous_process = pool, process
        return [s for s in ranks.values() if s.current is not None or s.previous is not None]

    def _read(self, path: str, role: str) -> tuple[str, str, Pool]:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise TraceError(f"larger than {MAX_FILE_BYTES} bytes")
        with np.load(path, allow_pickle=False) as z:
            state = json.loads(bytes(z["state_json"]).decode())
            if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") != VERSION:
                raise TraceError("not a graphmon deploy state file of this version")
            rank, process, windows = state.get("rank"), state.get("process"), state.get("windows")
            if state.get("role") != role or not isinstance(rank, str) or not isinstance(process, str):
                raise TraceError("bad rank, role or process")
            if self.file(rank, role) != path:
                raise TraceError("its name does not match its rank")
            if not isinstance(windows, list) or not windows:
                raise TraceError("no windows")
            pool = Pool(int(state["max_replays"]), int(state["max_bytes"]), carry=_carry(state, z))
            limits = ReadLimits(max_decompressed_bytes=MAX_FILE_BYTES)
            for i, w in enumerate(windows):
                if not (isinstance(w, list) and len(w) == 2 and isinstance(w[0], str)
                        and isinstance(w[1], (int, float))):
                    raise TraceError(f"bad window entry {i}")
                with np.load(io.BytesIO(z[f"w{i}"].tobytes()), allow_pickle=False) as inner:
                    trace = read_native(inner, limits=limits)
                    untraced = read_native_untraced(inner, len(trace.graphs), limits)
                pool.add(pooled(w[0], trace, float(w[1]), untraced))
        return rank, process, pool


def _carry(state: dict, z) -> dict[str, np.ndarray]:
    """The pool's carry: ``untraced_carry`` ([key, count], ...) cutting ``carry_ns`` (none in old files)."""
    entries = state.get("untraced_carry", [])
    if not entries:
        return {}
    if not (isinstance(entries, list) and all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
                                              and isinstance(e[1], int) and e[1] > 0 for e in entries)):
        raise TraceError("bad untraced_carry")
    d = z["carry_ns"]
    if d.dtype != np.int64 or d.ndim != 1 or len(d) != sum(n for _, n in entries) or (d <= 0).any():
        raise TraceError("carry_ns does not match untraced_carry")
    cuts = np.cumsum([n for _, n in entries])[:-1]
    return {k: part[-UNTRACED_SAMPLES:] for (k, _), part in zip(entries, np.split(d, cuts))}


def _json_bytes(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _why(e: Exception) -> str:
    if isinstance(e, (zipfile.BadZipFile, EOFError)):
        return "truncated or not an npz"
    if isinstance(e, KeyError):
        return f"missing {e}"
    return f"{type(e).__name__}: {e}"[:200]
