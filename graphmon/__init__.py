"""graphmon: live CUDA-graph kernel-gap timing for LLM serving, exported to Prometheus.

Importing graphmon is cheap and needs neither CUDA, torch nor cupti: the CUPTI source is
imported lazily by :func:`attach` on a GPU host.
"""

__version__ = "0.1.0"
