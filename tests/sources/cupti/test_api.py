"""The CUPTI adapter's buffer pool and callbacks (sources/cupti/api.py), without libcupti."""

import ctypes

import numpy as np

from graphmon.sources.cupti.api import BufferPool


def request(pool):
    buf, size, mx = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t(7)
    pool.request_cb(ctypes.byref(buf), ctypes.byref(size), ctypes.byref(mx))  # as libcupti calls it
    return buf.value or 0, size.value, mx.value


def test_pool_hands_out_fixed_buffers_and_refuses_when_empty():
    pool = BufferPool(4096 + 3, 2)
    assert pool.size_bytes == 4096  # a multiple of 8: records are 8-byte aligned
    a, size, mx = request(pool)
    b, _, _ = request(pool)
    assert a and b and a != b and size == 4096 and mx == 0 and a % 8 == 0
    assert request(pool) == (0, 0, 0) and pool.refused[0] == 1  # none free: CUPTI drops and counts
    ctypes.memmove(a, bytes(range(16)), 16)
    pool.complete_cb(None, 0, a, 4096, 16)  # the completion callback only queues
    assert list(pool.done) == [(a, 16)]
    addr, valid = pool.done.popleft()
    assert np.array_equal(pool.view(addr, valid), np.arange(16, dtype=np.uint8))  # a view of CUPTI's bytes
    pool.free.append(addr)
    assert request(pool)[0] == a  # reused only after it came back
    assert not pool.owns(12345)


def test_adapter_module_is_the_only_cupti_importer():
    import pathlib
    import re

    import graphmon

    root = pathlib.Path(graphmon.__file__).parent
    hits = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
            if re.search(r"^\s*(from cupti\b|import cupti\b)|cuptiActivity", p.read_text(), re.M)]
    assert hits == ["sources/cupti/api.py"], hits
    assert not re.search(r"\.finalize\(", (root / "sources/cupti/api.py").read_text())  # broke the CUDA context on the H200
