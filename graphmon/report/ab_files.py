"""``graphmon ab``'s raw-data folder: step times (npz), one native trace per arm and meta (JSON),
enough to redo the report on a CPU (``graphmon ab --from DIR``)."""

from __future__ import annotations

import json
import os
from typing import Mapping, Sequence

import numpy as np

from graphmon.formats.native import write_trace

from graphmon.analysis.ab import ArmData
from graphmon.model.trace import TraceError


def save_raw(arms: Sequence[ArmData], directory: str | os.PathLike, meta: Mapping | None = None) -> None:
    """Write ``arms`` and ``meta`` into ``directory`` (created if needed)."""
    os.makedirs(directory, exist_ok=True)
    arrays = {}
    for a in arms:
        arrays[f"step_us__{a.name}"] = a.step_us
        if a.traced_step_us is not None:
            arrays[f"traced_step_us__{a.name}"] = a.traced_step_us
        if a.trace is not None:
            write_trace(a.trace, os.path.join(directory, f"trace-{a.name}.graphmon.npz"))
    np.savez_compressed(os.path.join(directory, "ab-raw.npz"), **arrays)
    with open(os.path.join(directory, "ab-meta.json"), "w") as fh:
        json.dump({"arms": [a.name for a in arms], **dict(meta or {})}, fh, indent=2, default=str)


def load_raw(directory: str | os.PathLike) -> tuple[list[ArmData], dict]:
    """The arms and meta that :func:`save_raw` wrote (TraceError when ``directory`` is not one)."""
    from graphmon.formats.read import read_trace

    try:
        with open(os.path.join(directory, "ab-meta.json")) as fh:
            meta = json.load(fh)
        raw = np.load(os.path.join(directory, "ab-raw.npz"))
    except (OSError, ValueError) as e:
        raise TraceError(f"{directory}: not an A/B raw-data folder ({e})") from None
    arms = []
    for name in meta["arms"]:
        tp = os.path.join(directory, f"trace-{name}.graphmon.npz")
        arms.append(ArmData(
            name=name, step_us=raw[f"step_us__{name}"],
            traced_step_us=raw[f"traced_step_us__{name}"] if f"traced_step_us__{name}" in raw else None,
            trace=read_trace(tp, progress=False) if os.path.exists(tp) else None,
        ))
    return arms, meta
