"""vLLM integration: vLLM loads every ``vllm.general_plugins`` entry point in each process it
creates (API server, EngineCore, workers), so ``vllm serve`` needs no wrapper.

``register()`` installs graphmon's graph trigger when an agent is named (GRAPHMON_AGENT, e.g. a
sidecar's socket on a shared volume): only the processes that capture CUDA graphs (the workers)
then subscribe to CUPTI and send windows to the agent. Without an agent it does nothing: several
vLLM processes must never each open an exporter port. Cheap and never raises.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("graphmon")


def register() -> None:
    try:
        if os.environ.get("GRAPHMON_ATTACH", "1") == "0" or not os.environ.get("GRAPHMON_AGENT"):
            return
        from graphmon.host import trigger
        from graphmon.host.attach import attach_from_env

        if os.environ.get("GRAPHMON_SUBSCRIBE", "graph") == "off":
            return
        trigger.install(attach_from_env)  # idempotent: the sitecustomize hook may have done it already
    except Exception as e:  # a plugin must never take vLLM down
        log.warning("graphmon: vLLM plugin failed: %r", e)
