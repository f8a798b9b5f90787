"""The engine's workload identity as labels on every series of its rank.

A light collector's hello carries ``namespace``, ``pod``, ``container``, ``workload`` and ``build``
(graphmon.host.workload: the downward API in the shipped manifests). In a DaemonSet one agent
serves the engine pods of a node, so the target labels Prometheus adds name the agent's pod, not
the engine's; these labels name the engine's (the shipped PodMonitor sets ``honorLabels: true``,
so where both exist the engine's values are kept). Values are cut to ``--max-label-length`` like
every label value; empty values are left out (Prometheus reads a missing label as empty). They
add no series: one process has one value of each, and a new pod is a new series anyway.

Why labels on every series and not an info metric joined in PromQL: the fleet rules, the canary
queries and the dashboards aggregate by workload and build directly (``sum by (workload, build,
...)``), and a join on ``rank`` could pair a series with the wrong pod when two pods' processes
share a rank on one node.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from prometheus_client.core import Metric

from graphmon.export.detail import cap_label

WORKLOAD_LABELS = ("namespace", "pod", "container", "workload", "build")
SAME_WORKLOAD = ("namespace", "workload", "container")  # who may take a rank's series over


def workload_labels(process: Mapping[str, str], max_len: Optional[int] = None) -> dict[str, str]:
    """The non-empty workload labels of one process (its hello identity), cut to ``max_len``
    (the agent cuts them once, when the process connects)."""
    return {k: cap_label(str(process[k]), max_len) if max_len else str(process[k])
            for k in WORKLOAD_LABELS if process.get(k)}


def takeover_key(process: Mapping[str, str]) -> tuple[str, ...]:
    """Processes with the same key may take each other's rank series over."""
    return tuple(str(process.get(k, "")) for k in SAME_WORKLOAD)


def label_by_rank(families: Iterable[Metric], by_rank: Mapping[str, Mapping[str, str]]) -> list[Metric]:
    """The families with each sample of a rank in ``by_rank`` given that rank's labels (a sample's
    own labels win: ``rank`` or a family's own label of the same name is never overwritten)."""
    out = []
    for fam in families:
        if by_rank:
            fam.samples = [s._replace(labels={**by_rank[s.labels["rank"]], **s.labels})
                           if s.labels.get("rank") in by_rank else s for s in fam.samples]
        out.append(fam)
    return out

