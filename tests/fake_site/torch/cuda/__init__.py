"""Fake torch.cuda: a device per CUDA_VISIBLE_DEVICES entry, properties with UUID and PCI bus id."""
import os
from types import SimpleNamespace

from torch.cuda.graphs import CUDAGraph, graph  # noqa: F401  (as torch/cuda/__init__.py does)

_device = None


def is_available():
    return True


def is_initialized():
    return _device is not None


def set_device(i):
    global _device
    _device = int(i)


def current_device():
    global _device
    if _device is None:
        _device = 0
    return _device


def _physical(i):
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    return int(vis.split(",")[i]) if vis else i


def get_device_properties(i):
    p = _physical(i)
    return SimpleNamespace(name="Fake H200", uuid=f"00000000-0000-0000-0000-{p:012d}", pci_bus_id=0x10 + p,
                           pci_domain_id=0, pci_device_id=0)
