"""Activity buffers -> columns (sources/cupti/records.py) on buffers laid out as libcupti writes them."""

import os

import numpy as np
import pytest

from graphmon.sources.cupti.records import ARENA_KEEP_RECORDS, PROBE_BYTES, BufferDecoder, ColumnArena, NameTable, RecordStore

from fake_cupti import KERNEL10_BYTES, KERNEL13_BYTES, pack_kernel
from graphmon.sources.cupti import native


@pytest.fixture(autouse=True, params=["native", "numpy"])
def decode_path(request, monkeypatch):
    """Every test here on both decode paths: the C pass (_decode.c) and numpy."""
    lib = native.load()
    if request.param == "native" and lib is None:
        if os.environ.get("GRAPHMON_REQUIRE_NATIVE") == "1":
            pytest.fail(f"native decode required (GRAPHMON_REQUIRE_NATIVE=1): {native.status()}")
        pytest.skip(f"native decode: {native.status()}")
    monkeypatch.setitem(native._STATE, "lib", lib if request.param == "native" else None)
    return request.param


def synth_buffer(n, record_bytes, seed=0):
    """n CONCURRENT_KERNEL records of ``record_bytes`` built with numpy at cupti_activity.h's
    offsets (kind@0 u32, start@16, end@24, completed@32 u64, deviceId@40, contextId@44,
    streamId@48 u32, correlationId@92 u32, gridId@96 i64, name@104 ptr, graphNodeId@144 u64,
    graphId@156 u32), plus the expected columns."""
    rng = np.random.default_rng(seed)
    raw = np.zeros((n, record_bytes), np.uint8)
    want = {
        "start_ns": rng.integers(1, 2**62, n), "stream": rng.integers(0, 2**32, n), "device": rng.integers(0, 8, n),
        "correlation_id": rng.integers(0, 2**32, n), "graph_node_id": rng.integers(0, 2**63, n),
        "graph_id": rng.integers(0, 2**32, n), "name_ptr": rng.integers(1, 2**47, n).astype(np.uint64),
    }
    want["end_ns"] = want["start_ns"] + rng.integers(0, 10**6, n)

    def put(off, typ, vals):
        raw[:, off:off + np.dtype(typ).itemsize] = np.asarray(vals).astype(typ).view(np.uint8).reshape(n, -1)

    put(0, "<u4", np.full(n, 10))
    put(16, "<u8", want["start_ns"])
    put(24, "<u8", want["end_ns"])
    put(32, "<u8", want["end_ns"])
    put(40, "<u4", want["device"])
    put(44, "<u4", np.ones(n))
    put(48, "<u4", want["stream"])
    put(92, "<u4", want["correlation_id"])
    put(96, "<i8", rng.integers(0, 100, n))
    put(104, "<u8", want["name_ptr"])
    put(144, "<u8", want["graph_node_id"])
    put(156, "<u4", want["graph_id"])
    raw[:, 160:] = 0xAB  # fields graphmon does not read (clusters, channel, ...): must not matter
    return raw.reshape(-1), want


def walker(sizes):
    def walk(data):
        out, off = [], 0
        while off + 4 <= len(data):
            size = sizes.get(int(data[off:off + 4].view("<u4")[0]))
            if not size:
                break
            out.append(off)
            off += size
        return np.asarray(out, np.int64)
    return walk


def check(cols, want, sel=slice(None)):
    for k, v in want.items():
        assert np.array_equal(getattr(cols, k), np.asarray(v)[sel].astype(getattr(cols, k).dtype)), k


@pytest.mark.parametrize("record_bytes", [KERNEL13_BYTES, KERNEL10_BYTES])
def test_real_layout_buffers_decode_to_the_expected_columns(record_bytes):
    data, want = synth_buffer(500, record_bytes)
    walked, walk = [], walker({10: record_bytes})
    dec = BufferDecoder(walk=lambda d: walked.append(len(d)) or walk(d))
    cols = dec.decode(data)  # the record size is measured by walking the buffer's first records only
    check(cols, want)
    assert dec.record_bytes == record_bytes and dec.stats.fallback_buffers == 0
    assert walked == [PROBE_BYTES]  # not a ctypes call per record of the whole buffer (H200: 0.5 M records/s)
    cols = dec.decode(data[: 2 * record_bytes])  # then one gather per buffer: no walk
    check(cols, want, slice(0, 2))
    assert walked == [PROBE_BYTES] and dec.stats.fallback_buffers == 0 and dec.stats.records == 502


def test_a_pack_kernel_record_and_the_synthesized_one_agree():
    # two independent encodings of the header layout (struct in the fake, numpy here)
    data, want = synth_buffer(1, KERNEL13_BYTES, seed=3)
    buf = bytearray(KERNEL13_BYTES)
    pack_kernel(buf, 0, start=int(want["start_ns"][0]), end=int(want["end_ns"][0]), device=int(want["device"][0]),
                stream=int(want["stream"][0]), corr=int(want["correlation_id"][0]), name_ptr=int(want["name_ptr"][0]),
                graph_node_id=int(want["graph_node_id"][0]), graph_id=int(want["graph_id"][0]))
    dec = BufferDecoder(walk=walker({10: KERNEL13_BYTES}), record_bytes=KERNEL13_BYTES)
    check(dec.decode(np.frombuffer(bytes(buf), np.uint8)), want)


def test_unexpected_kinds_and_sizes_take_the_fallback_and_are_counted():
    rb = KERNEL13_BYTES
    data, want = synth_buffer(6, rb)
    other = np.zeros(24, np.uint8)
    other[:4] = np.array([99], "<u4").view(np.uint8)  # a record of another kind, of another size
    mixed = np.concatenate([data[: 3 * rb], other, data[3 * rb:]])
    dec = BufferDecoder(walk=walker({10: rb, 99: 24}), record_bytes=rb)
    cols = dec.decode(mixed)
    check(cols, want)
    assert (dec.stats.fallback_buffers, dec.stats.fallback_records, dec.stats.other_kind_records) == (1, 7, 1)
    # right size, wrong kind in the middle: the view notices (kind check), the walk skips it
    data2, _ = synth_buffer(4, rb)
    data2[2 * rb: 2 * rb + 4] = np.array([99], "<u4").view(np.uint8)
    dec2 = BufferDecoder(walk=walker({10: rb, 99: rb}), record_bytes=rb)
    assert len(dec2.decode(data2)) == 3 and dec2.stats.other_kind_records == 1
    assert len(dec2.decode(np.zeros(0, np.uint8))) == 0


def test_record_store_bounds_the_window_and_counts_the_rest():
    data, want = synth_buffer(10, KERNEL13_BYTES)
    dec = BufferDecoder(walk=walker({10: KERNEL13_BYTES}), record_bytes=KERNEL13_BYTES)
    st = RecordStore(max_records=15, chunk_records=4)  # a buffer spans chunks; the second only half fits
    assert dec.gather(data, st) == 10 and dec.gather(data, st) == 10
    assert st.n_records == 15 and st.discarded == 5
    cols, name_id = st.take()
    check(cols, {k: np.concatenate([v, v])[:15] for k, v in want.items()})
    assert name_id is None and st.n_records == 0 and st.discarded == 0


def test_a_window_is_made_into_columns_chunk_by_chunk_with_pauses_and_name_ids():
    data, want = synth_buffer(7, KERNEL13_BYTES, seed=4)
    dec = BufferDecoder(walk=walker({10: KERNEL13_BYTES}), record_bytes=KERNEL13_BYTES)
    st = RecordStore(max_records=100, chunk_records=8)
    for _ in range(4):
        dec.gather(data, st)  # 28 records: chunks of 8, 8, 8, 4
    pauses, names = [], NameTable(lambda p: f"k{p % 3}")
    cols, name_id = st.take(lambda: pauses.append(1), names)
    assert len(pauses) == 3  # between chunks: a 2M-record capture is many short GIL holds, not one long one
    check(cols, {k: np.tile(v, 4) for k, v in want.items()})
    assert [names.names[i] for i in name_id] == [f"k{p % 3}" for p in np.tile(want["name_ptr"], 4).tolist()]


def test_the_store_reuses_its_chunks_from_window_to_window():
    data, _ = synth_buffer(6, KERNEL13_BYTES)
    dec = BufferDecoder(walk=walker({10: KERNEL13_BYTES}), record_bytes=KERNEL13_BYTES)
    st = RecordStore(max_records=100, chunk_records=4)
    dec.gather(data, st)
    first = [id(c) for c in st._chunks]
    st.take()
    dec.gather(data, st)  # the next window writes into the same memory: no allocation, no page faults
    assert sorted(id(c) for c in st._chunks) == sorted(first)


def test_a_wrong_kind_found_in_a_later_chunk_rewinds_the_buffer_and_walks_it():
    rb = KERNEL13_BYTES
    data, want = synth_buffer(6, rb, seed=5)
    data[4 * rb: 4 * rb + 4] = np.array([99], "<u4").view(np.uint8)  # in the buffer's second chunk
    dec = BufferDecoder(walk=walker({10: rb, 99: rb}), record_bytes=rb)
    st = RecordStore(max_records=100, chunk_records=3)
    good, _ = synth_buffer(2, rb, seed=6)
    dec.gather(good, st)  # an earlier buffer of the window stays
    dec.gather(data, st)
    keep = np.arange(6) != 4
    cols, _ = st.take()
    assert len(cols) == 7 and dec.stats.fallback_buffers == 1 and dec.stats.other_kind_records == 1
    check(type(cols)(*(getattr(cols, c)[2:] for c in cols.__dataclass_fields__)), want, keep)


def test_name_table_reads_each_pointer_once():
    reads = []
    table = NameTable(lambda p: reads.append(p) or f"k{p % 3}")
    ids = table.ids(np.array([7, 8, 7, 9, 8], np.uint64))
    assert [table.names[i] for i in ids] == ["k1", "k2", "k1", "k0", "k2"]
    assert table.ids(np.array([9, 7, 10], np.uint64)).tolist() == [2, 0, 0]  # 10 -> "k1": the same name
    table.new_window()
    assert table.ids(np.array([8], np.uint64)).tolist() == [0] and table.names == ["k2"]
    assert sorted(reads) == [7, 8, 9, 10]  # each pointer read once for the process



@pytest.mark.parametrize("collide", [False, True])
def test_name_ids_match_a_dict_lookup_whatever_the_hash_slots(collide):
    rng = np.random.default_rng(7)
    ptrs = (rng.choice(1 << 20, 300, replace=False).astype(np.uint64) * np.uint64(48)) + np.uint64(0x7F00_0000_0000)
    text = {int(p): f"kernel_{i % 250}" for i, p in enumerate(ptrs)}  # some pointers share a name
    table = NameTable(lambda p: text[p])
    if collide:  # every pointer in one slot: all but one found by the binary search
        table._slot = lambda a: np.zeros(len(a), np.uint64)
        table._rehash()
    for _ in range(3):
        table.new_window()
        window = rng.choice(ptrs[: rng.integers(50, 301)], 5000)
        ids = table.ids(window)
        assert [table.names[i] for i in ids.tolist()] == [text[int(p)] for p in window]
        assert len(table.names) == len(set(table.names))  # one window id per name


def test_a_column_arena_is_reused_and_bounded():
    data, want = synth_buffer(10, KERNEL13_BYTES)
    dec = BufferDecoder(walk=walker({10: KERNEL13_BYTES}), record_bytes=KERNEL13_BYTES)
    st, arena = RecordStore(max_records=10_000), ColumnArena()
    dec.gather(data, st)
    a, _ = st.take(arena=arena)
    check(a, want)
    dec.gather(data, st)
    b, _ = st.take(arena=arena)
    assert np.shares_memory(a.start_ns, b.start_ns)  # the same memory: no page faults window after window
    assert arena.get(ARENA_KEEP_RECORDS + 1) is None  # a capture's columns: fresh, never held by the arena
    st = RecordStore(max_records=10_000, chunk_records=4)
    for _ in range(3):
        dec.gather(data, st)
    c, _ = st.take(arena=ColumnArena(max_records=5))  # above the arena's bound: fresh columns, all there
    check(c, {k: np.tile(v, 3) for k, v in want.items()})


def test_warm_up_makes_the_first_decode_of_a_fresh_process_cheap(decode_path):
    # a fresh interpreter: the first real buffer after warm_up() costs what later ones do
    import subprocess
    import sys

    code = (
        "import time, numpy as np\n"
        "from graphmon.sources.cupti.records import warm_up, BufferDecoder, NameTable, RecordStore\n"
        "from fake_cupti import KERNEL13_BYTES, pack_kernel\n"
        "warm = {'1': True, '0': False}[__import__('sys').argv[1]]\n"
        "if warm: warm_up()\n"
        "buf = bytearray(500 * KERNEL13_BYTES)\n"
        "for i in range(500): pack_kernel(buf, i * KERNEL13_BYTES, start=i, end=i + 1, stream=7, corr=i, name_ptr=64 + i % 5)\n"
        "data = np.frombuffer(bytes(buf), np.uint8)\n"
        "dec = BufferDecoder(walk=lambda d: np.arange(0, len(d), KERNEL13_BYTES), record_bytes=KERNEL13_BYTES)\n"
        "names = NameTable(lambda p: str(p))\n"
        "t = []\n"
        "for _ in range(3):\n"
        "    c = time.thread_time(); st = RecordStore(10_000); dec.gather(data, st); st.has_all(np.arange(3))\n"
        "    st.take(lambda: None, names); t.append(time.thread_time() - c)\n"
        "print(t[0] / max(min(t[1:]), 1e-6))\n"
    )
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]),
               GRAPHMON_NATIVE_DECODE="1" if decode_path == "native" else "0")
    ratio = {w: float(subprocess.run([sys.executable, "-c", code, w], env=env, capture_output=True, text=True,
                                     check=True).stdout) for w in ("0", "1")}
    assert ratio["0"] > 5 * ratio["1"], ratio  # cold: many times a warm decode; warmed: about the same
