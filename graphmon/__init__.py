"""graphmon: live CUDA-graph kernel-gap timing for LLM serving, exported to Prometheus.

Importing graphmon is cheap and needs neither CUDA, torch nor cupti: ``graphmon.host.attach`` is
stdlib-only at import time; the exporter, numpy and the CUPTI source (which imports cupti
lazily) load when ``attach()`` runs.
"""

from graphmon.version import __version__  # noqa: E402

# graphmon.attach(...) is the function from graphmon.host.attach.
from graphmon.host.attach import attach, detach, label_graph  # noqa: E402

__all__ = ["attach", "detach", "label_graph", "__version__"]
