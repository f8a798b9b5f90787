"""The engine's workload identity, as its light collector says it in the hello.

A deploy replaces the engine's pod; in a DaemonSet one agent serves the engine pods of a whole node.
So every series of a process carries who it is (graphmon.export.identity exports them as labels):

- ``namespace``, ``pod``: ``GRAPHMON_POD_NAMESPACE``, ``GRAPHMON_POD_NAME`` (the manifests set them
  with the downward API: ``metadata.namespace``, ``metadata.name``);
- ``container``: ``GRAPHMON_CONTAINER_NAME`` (a literal in the manifest: the downward API has no
  container name);
- ``build``: ``GRAPHMON_BUILD`` (set it to the image tag or commit), else the pod's template hash
  (``GRAPHMON_POD_TEMPLATE_HASH`` from the ``pod-template-hash`` label a Deployment's ReplicaSet
  sets, or ``rollouts-pod-template-hash`` for an Argo Rollout): one value per build of the pod
  spec, the same for every pod of that build and again for a rollback to it;
- ``workload``: ``GRAPHMON_WORKLOAD``, else the pod name without the ``-<template hash>-<suffix>``
  a ReplicaSet gives it (``vllm-7d9f8b6c4-x2x9q`` -> ``vllm``), else the pod name.

Outside Kubernetes all are "" (no label value), unless the variables are set by hand.
"""

from __future__ import annotations

import os
import time
from typing import Mapping, Optional

WORKLOAD_KEYS = ("namespace", "pod", "container", "workload", "build")
# When this module is imported: with the pid and host, it tells a restarted process from the one
# before it that had the same pid (containers start their engine with the same pid every time).
PROCESS_START_S = f"{time.time():.6f}"


def workload_identity(env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = os.environ if env is None else env

    def get(*names: str) -> str:
        return next((env[n].strip() for n in names if env.get(n, "").strip()), "")

    pod = get("GRAPHMON_POD_NAME")
    template_hash = get("GRAPHMON_POD_TEMPLATE_HASH")
    workload = get("GRAPHMON_WORKLOAD") or workload_of(pod, template_hash)
    return {"namespace": get("GRAPHMON_POD_NAMESPACE"), "pod": pod, "container": get("GRAPHMON_CONTAINER_NAME"),
            "workload": workload, "build": get("GRAPHMON_BUILD") or template_hash}


def workload_of(pod: str, template_hash: str) -> str:
    """The Deployment (or Rollout) a pod belongs to, from its name and template hash."""
    if template_hash:
        head, sep, _ = pod.rpartition(f"-{template_hash}-")
        if sep and head:
            return head
    return pod
