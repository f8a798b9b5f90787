"""The native decode pass (sources/cupti/native.py, _decode.c) against the numpy path: the same
rows, columns, name ids and window names on any buffers, and its own edges."""

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from graphmon.sources.cupti import native
from graphmon.sources.cupti.records import _WORDS64, COLUMNS, BufferDecoder, NameTable, RecordStore

from fake_cupti import KERNEL10_BYTES, KERNEL13_BYTES

LIB = native.load()
if LIB is None:
    if os.environ.get("GRAPHMON_REQUIRE_NATIVE") == "1":  # CI builds it: a silent skip would hide a broken build
        raise RuntimeError(f"native decode required (GRAPHMON_REQUIRE_NATIVE=1): {native.status()}")
    pytest.skip(f"native decode: {native.status()}", allow_module_level=True)


def records(n, record_bytes, rng, ptrs, other_at=()):
    """n kernel records with random fields and names from ``ptrs``; kind 99 at ``other_at``."""
    raw = rng.integers(0, 256, (n, record_bytes), dtype=np.uint8)  # every byte random: only graphmon's fields matter
    words = raw.view(np.uint64)
    kinds = raw[:, :4].view("<u4")
    kinds[:, 0] = 10
    for i in other_at:
        kinds[i, 0] = 99
    words[:, 13] = rng.choice(ptrs, n)  # name pointer @104
    return raw.reshape(-1)


def walker(record_bytes):
    return lambda d: np.arange(0, len(d) - record_bytes + 1, record_bytes, dtype=np.int64)


def run_windows(lib, windows, record_bytes, chunk, max_records, text):
    """Every window through one decoder, store and name table; each window's columns and names."""
    dec = BufferDecoder(walk=walker(record_bytes), record_bytes=record_bytes, native=lib)
    store = RecordStore(max_records, chunk_records=chunk, native=lib)
    names = NameTable(lambda p: text[p])
    out = []
    for bufs in windows:
        names.new_window()
        got = [dec.gather(b, store) for b in bufs]
        discarded = store.discarded
        cols, name_id = store.take(lambda: None, names)
        out.append((got, discarded, {k: getattr(cols, k).copy() for k in COLUMNS}, name_id.copy(), list(names.names)))
    return out, dec.stats


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), record_bytes=st.sampled_from([KERNEL13_BYTES, KERNEL10_BYTES]),
       chunk=st.integers(1, 40), max_records=st.integers(1, 400), n_windows=st.integers(1, 4),
       n_ptrs=st.integers(1, 300), shared_text=st.booleans())
def test_native_and_numpy_paths_agree_on_any_windows(seed, record_bytes, chunk, max_records, n_windows, n_ptrs,
                                                     shared_text):
    rng = np.random.default_rng(seed)
    ptrs = rng.choice(1 << 40, n_ptrs, replace=False).astype(np.uint64) * np.uint64(16)
    # kernels that share a name (a template instantiated twice): one id for both pointers
    text = {int(p): f"k{i % (7 if shared_text else n_ptrs)}" for i, p in enumerate(ptrs)}
    windows = []
    for _ in range(n_windows):
        bufs = []
        for _ in range(int(rng.integers(0, 4))):
            n = int(rng.integers(0, 120))
            other = rng.choice(n, int(rng.integers(0, 2)), replace=False) if n and rng.random() < 0.3 else ()
            bufs.append(records(n, record_bytes, rng, ptrs[: int(rng.integers(1, n_ptrs + 1))], other))
        windows.append(bufs)
    got, st_native = run_windows(LIB, windows, record_bytes, chunk, max_records, text)
    want, st_numpy = run_windows(None, windows, record_bytes, chunk, max_records, text)
    for g, w in zip(got, want):
        assert g[0] == w[0] and g[1] == w[1]  # records per buffer, discarded
        for k in COLUMNS:
            assert np.array_equal(g[2][k], w[2][k]), k
        # the same name for every record, and the same window names, each once (their order may
        # differ: names of pointers the hash table missed are numbered after the C pass's)
        assert (g[3] >= 0).all() and [g[4][i] for i in g[3]] == [w[4][i] for i in w[3]]
        assert sorted(g[4]) == sorted(w[4]) and len(set(g[4])) == len(g[4])
    assert st_native == st_numpy  # the same buffers walked, the same kinds counted


def test_gather_stops_at_the_first_record_of_another_kind():
    rng = np.random.default_rng(1)
    data = records(5, KERNEL13_BYTES, rng, np.array([64], np.uint64), other_at=(3,))
    rows = np.frombuffer(data, np.uint64).reshape(5, KERNEL13_BYTES // 8)
    out = np.zeros((5, len(_WORDS64)), np.uint64)
    assert LIB.gather(rows, _WORDS64, out, 10) == -1 - 3
    assert np.array_equal(out[:3], rows[:3][:, _WORDS64])  # the rows before it were gathered
    assert LIB.gather(rows[:3], _WORDS64, out[:3], 10) == 3


def test_names_the_hash_table_misses_are_resolved_and_numbered_like_numpy():
    # every pointer in one slot: all but one come back as misses, resolved by NameTable.ids
    ptrs = np.arange(1, 41, dtype=np.uint64) * np.uint64(64)
    text = {int(p): f"k{int(p) % 9}" for p in ptrs}
    rng = np.random.default_rng(2)
    bufs = [records(300, KERNEL13_BYTES, rng, ptrs)]
    out = {}
    for name, lib in (("native", LIB), ("numpy", None)):
        dec = BufferDecoder(walk=walker(KERNEL13_BYTES), record_bytes=KERNEL13_BYTES, native=lib)
        store = RecordStore(1000, chunk_records=64, native=lib)
        names = NameTable(lambda p: text[p])
        names._slot = lambda a: np.zeros(len(a), np.uint64)
        for w in range(2):  # a first window learns the pointers, the second finds them through the table
            names.new_window()
            dec.gather(bufs[0], store)
            cols, name_id = store.take(lambda: None, names)
        out[name] = [names.names[i] for i in name_id]
    assert out["native"] == out["numpy"] == [text[int(p)] for p in cols.name_ptr]


def test_the_native_path_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("GRAPHMON_NATIVE_DECODE", "0")
    assert native.load() is None and native.status().startswith("off")
    assert BufferDecoder(walk=walker(KERNEL13_BYTES)).native is None
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.delenv("GRAPHMON_NATIVE_DECODE")
    assert native.load() is not None and native.status() == "native"


def test_the_collector_says_which_decode_runs(monkeypatch):
    from graphmon.sources.cupti.collector import CuptiSource

    from fake_cupti import FakeCupti

    assert CuptiSource(FakeCupti()).info()["decode"] == "native"
    monkeypatch.setitem(native._STATE, "lib", None)  # as where the install found no C compiler
    assert CuptiSource(FakeCupti()).info()["decode"] == "numpy"


def test_mismatched_arrays_are_refused_before_the_c_pass():
    # checked in Python (not asserts, which python -O strips): a wrong shape would be a bad pointer
    rows = np.zeros((4, KERNEL13_BYTES // 8), np.uint64)
    with pytest.raises(ValueError):
        LIB.gather(rows, _WORDS64, np.zeros((3, len(_WORDS64)), np.uint64), 10)
    with pytest.raises(ValueError):
        LIB.gather(rows[:, :10], _WORDS64, np.zeros((4, len(_WORDS64)), np.uint64), 10)  # words past the record
    from graphmon.sources.cupti.records import _AT32, _AT64, KernelColumns

    chunk = np.zeros((4, len(_WORDS64)), np.uint64)
    cols = KernelColumns.empty()
    with pytest.raises(ValueError):
        LIB.columns(chunk, _AT64, _AT32, tuple(getattr(cols, k) for k in COLUMNS), None, None)


def test_big_windows_get_columns_in_small_pages_and_both_paths_agree(monkeypatch):
    """A window's columns from HUGE_PAGE_BYTES on are mmap'd small pages (no huge-page faults in
    the C pass's pieces; bench/collector/decode_buffers.py): writable arrays, the same values both ways."""
    import graphmon.sources.cupti.pages as pages_mod

    monkeypatch.setattr(pages_mod, "HUGE_PAGE_BYTES", 256)  # every column of 40+ records
    rng = np.random.default_rng(7)
    ptrs = rng.choice(1 << 40, 50, replace=False).astype(np.uint64) * np.uint64(16)
    text = {int(p): f"k{i}" for i, p in enumerate(ptrs)}
    windows = [[records(500, KERNEL13_BYTES, rng, ptrs) for _ in range(3)] for _ in range(2)]
    got, _ = run_windows(LIB, windows, KERNEL13_BYTES, 64, 10_000, text)
    want, _ = run_windows(None, windows, KERNEL13_BYTES, 64, 10_000, text)
    for g, w in zip(got, want):
        for k in COLUMNS:
            assert np.array_equal(g[2][k], w[2][k]), k
        assert [g[4][i] for i in g[3]] == [w[4][i] for i in w[3]]
    col = pages_mod._fresh(1000, np.int64)
    base = col
    while isinstance(base, np.ndarray):
        base = base.base
    assert col.flags.writeable and col.flags.c_contiguous and isinstance(base.obj, __import__("mmap").mmap)
    col[:] = 5
    assert int(col.sum()) == 5000
