"""A fake torch: just what graphmon's hook and identity code touch (tests only)."""
__version__ = "0.0+fake"
from torch import cuda, distributed  # noqa: E402,F401
