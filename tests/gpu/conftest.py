"""GPU tests run only where torch sees a CUDA device and cupti-python imports."""

import pytest


def _gpu_ready() -> str:
    try:
        import torch
    except Exception as e:
        return f"torch not importable: {e!r}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from cupti import cupti  # noqa: F401
    except Exception as e:
        return f"cupti-python not importable: {e!r}"
    return ""


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            if reason is None:
                reason = _gpu_ready()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
