"""CUPTI activity buffers -> numpy columns, with no Python object per record.

A buffer holds CUpti_ActivityKernel records back to back (8-byte aligned). Their size depends
on libcupti (CUpti_ActivityKernel10: 216 bytes in CUPTI 13.0, CUpti_ActivityKernel13: 248 bytes
in 13.4), but the fields graphmon reads sit at the same offsets in every version since
Kernel5 (cupti_activity.h). So the decoder views a buffer as rows of the record size
*measured at runtime* (the distance between the first records libcupti's own walker returns),
gathers the 9 words that hold those fields into the window's RecordStore (one np.take per
buffer) and checks every record's kind; the window's columns are made once, at its end.
Anything unexpected (another kind, a size that does not divide the buffer) takes the fallback
path: walk the records one by one with libcupti's walker and gather the kernel ones (counted).

The gather and the columns run in native.py's C pass when it was built (one read of each record,
no GIL), else with numpy here; both give the same rows, columns and name ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from graphmon.sources.cupti import native as _native
from graphmon.sources.cupti.pages import _fresh, _in_pages

KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KERNEL_KINDS = (KIND_KERNEL, KIND_CONCURRENT_KERNEL)

# (field, type, byte offset) in CUpti_ActivityKernel5..13: the same offsets in every version.
KERNEL_FIELDS = (
    ("kind", "<u4", 0),
    ("start", "<u8", 16),
    ("end", "<u8", 24),
    ("device_id", "<u4", 40),
    ("stream_id", "<u4", 48),
    ("correlation_id", "<u4", 92),
    ("name_ptr", "<u8", 104),
    ("graph_node_id", "<u8", 144),
    ("graph_id", "<u4", 156),
)
# The 8-byte words (byte offset // 8) that hold them, gathered into a row of 9 per record:
# (0, 2, 3, 5, 6, 11, 13, 18, 19). _AT: a 64-bit field's place in that row; _U32: a 32-bit
# field's place in the row's uint32 view (the low or high half of its word: little-endian, like
# every CUDA host).
_WORDS = np.array(sorted({off // 8 for _, _, off in KERNEL_FIELDS}), np.intp)
_AT = {name: int(np.searchsorted(_WORDS, off // 8)) for name, _, off in KERNEL_FIELDS}
_U32 = {name: 2 * _AT[name] + off % 8 // 4 for name, typ, off in KERNEL_FIELDS if typ == "<u4"}
# the same places as the C pass takes them (_decode.c: gm_gather, gm_columns)
_WORDS64 = _WORDS.astype(np.int64)
_AT64 = np.array([_AT[k] for k in ("start", "end", "graph_node_id", "name_ptr")], np.int64)
_AT32 = np.array([_U32[k] for k in ("stream_id", "device_id", "graph_id", "correlation_id")], np.int64)
PROBE_BYTES = 2048  # the first records of a buffer, walked to measure the record size
MIN_KERNEL_RECORD_BYTES = 160  # the fields above end at 160 (CUpti_ActivityKernel5's size)
KNOWN_RECORD_BYTES = {216: "CUpti_ActivityKernel10 (CUPTI 13.0)", 248: "CUpti_ActivityKernel13 (CUPTI 13.4)"}

COLUMNS = ("start_ns", "end_ns", "stream", "device", "graph_id", "graph_node_id", "correlation_id", "name_ptr")
_DTYPES = (np.int64, np.int64, np.int64, np.int32, np.int64, np.int64, np.int64, np.uint64)


@dataclass(frozen=True)
class KernelColumns:
    """Kernel records as columns (one array per field, same length)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    graph_id: np.ndarray
    graph_node_id: np.ndarray
    correlation_id: np.ndarray
    name_ptr: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    @classmethod
    def empty(cls) -> "KernelColumns":
        return cls(*(np.zeros(0, t) for t in _DTYPES))


@dataclass
class DecodeStats:
    buffers: int = 0
    records: int = 0
    fallback_buffers: int = 0  # buffers walked record by record
    fallback_records: int = 0
    other_kind_records: int = 0  # records of a kind graphmon did not ask for (skipped, counted)
    record_bytes: int = 0  # measured stride of kernel records; 0 until measured


WORDS_PER_RECORD = len(_WORDS)
CHUNK_RECORDS = 1 << 13  # rows of one store chunk (590 KB): also the records per piece of work at a window's end
KEEP_CHUNKS = 8  # chunks a store keeps between windows (4.7 MB): a default window needs one to three
_NO_ROWS = np.empty((0, WORDS_PER_RECORD), np.uint64)
_NO_PTR = np.uint64(2**64 - 1)  # an empty hash slot: never a user-space address
_FOUR = np.uint64(4)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the multiply spreads the pointer's bits


@dataclass
class BufferDecoder:
    """Gathers each buffer's kernel records into a RecordStore. ``walk(data) -> offsets`` is
    libcupti's record walker (the fallback path, and the record-size probe)."""

    walk: Callable[[np.ndarray], np.ndarray]
    record_bytes: int = 0  # 0: measure on the first buffer holding two kernel records
    stats: DecodeStats = field(default_factory=DecodeStats)
    native: Optional[_native.NativeDecode] = field(default_factory=_native.load)  # None: numpy

    def gather(self, data: np.ndarray, store: "RecordStore") -> int:
        """Append the buffer's kernel records to ``store`` as 9 words each; returns how many
        records the buffer held (the store keeps what fits and counts the rest as discarded).

        Every field graphmon reads sits in one of 9 aligned 8-byte words of a record (``_WORDS``),
        so one gather per buffer (the C pass's, or np.take) reads each record once (CUPTI's thread
        wrote the buffer: it is cold here) straight into the store's preallocated rows: no columns, no allocation per
        buffer. Columns are made once per window (RecordStore.columns)."""
        st = self.stats
        st.buffers += 1
        n_bytes = len(data)
        if not n_bytes:
            return 0
        if not self.record_bytes:
            self._measure(data)
        rb = self.record_bytes
        if rb >= MIN_KERNEL_RECORD_BYTES and rb % 8 == 0 and n_bytes % rb == 0:
            if data.ctypes.data % 8:
                data = data.copy()  # unaligned (never from CUPTI's pool): numpy's copy is aligned
            n = n_bytes // rb
            rows = np.frombuffer(data, np.uint64, count=n * rb // 8).reshape(n, rb // 8)
            mark = store.mark()
            nat = self.native
            at = 0
            while at < n:
                dst = store.reserve(n - at)
                if not len(dst):
                    break
                if nat is not None:
                    same_kind = nat.gather(rows[at:at + len(dst)], _WORDS64, dst, KIND_CONCURRENT_KERNEL) >= 0
                else:
                    np.take(rows[at:at + len(dst)], _WORDS, axis=1, out=dst)
                    same_kind = (dst.view(np.uint32)[:, _U32["kind"]] == KIND_CONCURRENT_KERNEL).all()
                if not same_kind:
                    store.rewind(mark)  # another kind in the buffer: walk it record by record
                    return self._walk(data, store)
                store.commit(len(dst))
                at += len(dst)
            store.count_discarded(n - at)
            st.records += n
            return n
        return self._walk(data, store)

    def decode(self, data: np.ndarray) -> KernelColumns:
        """One buffer's kernel records as columns (tests, benchmarks; the collector gathers a
        window's buffers into one store and makes columns once)."""
        store = RecordStore(max(1, len(data) // MIN_KERNEL_RECORD_BYTES + 1), native=self.native)
        self.gather(data, store)
        return store.columns()[0]

    def _measure(self, data: np.ndarray) -> None:
        """The record size from libcupti's own walk of the buffer's first records only: walking
        a whole buffer is a ctypes call per record under the GIL (~4,000 for 1 MB: ms of GIL,
        H200: 0.5 M records/s in a window that started a fresh decoder)."""
        offs = np.asarray(self.walk(data[:PROBE_BYTES]), np.int64)[:2]
        if len(offs) == 2 and offs[0] == 0:
            kinds = [int(data[o : o + 4].copy().view("<u4")[0]) for o in offs.tolist()]
            stride = int(offs[1] - offs[0])
            if all(k in KERNEL_KINDS for k in kinds) and stride >= MIN_KERNEL_RECORD_BYTES and stride % 8 == 0:
                self.record_bytes = self.stats.record_bytes = stride

    def _walk(self, data: np.ndarray, store: "RecordStore") -> int:
        st = self.stats
        offs = np.asarray(self.walk(data), np.int64)
        if not len(offs):
            return 0
        offs = offs[(offs >= 0) & (offs + MIN_KERNEL_RECORD_BYTES <= len(data))]
        kinds = data[offs[:, None] + np.arange(4)].copy().view("<u4").reshape(-1)
        is_kernel = np.isin(kinds, KERNEL_KINDS)
        stride = int(offs[1] - offs[0]) if len(offs) >= 2 else 0
        if not self.record_bytes and is_kernel[:2].all() and stride >= MIN_KERNEL_RECORD_BYTES and stride % 8 == 0:
            self.record_bytes = st.record_bytes = stride  # measured: libcupti's own stride
        st.fallback_buffers += 1
        st.fallback_records += len(offs)
        st.other_kind_records += int((~is_kernel).sum())
        k = offs[is_kernel]
        st.records += len(k)
        # each kernel record's first 160 bytes, copied aligned (a record could start anywhere), then its 9 words
        block = np.ascontiguousarray(data[k[:, None] + np.arange(MIN_KERNEL_RECORD_BYTES)]).view(np.uint64)
        store.append(block[:, _WORDS])
        return len(k)


class RecordStore:
    """The window's kernel records as rows of 9 words (``_WORDS``), in chunks of
    ``CHUNK_RECORDS`` rows that are reused from window to window (no allocation, no page faults
    in a default window), bounded by ``max_records`` (the rest counted as discarded). Only the
    collector thread touches it: CUPTI's callbacks never wait on it."""

    def __init__(self, max_records: int, chunk_records: int = CHUNK_RECORDS,
                 native: "Optional[_native.NativeDecode] | str" = "load") -> None:
        self.native = _native.load() if native == "load" else native  # None: numpy
        self.max_records = int(max_records)
        self.chunk_records = int(max(1, min(chunk_records, self.max_records)))
        self._chunks: list[np.ndarray] = []  # every chunk but the last is full
        self._spare: list[np.ndarray] = []  # chunks kept from earlier windows
        self._fill = 0  # rows used in the last chunk
        self.n_records = 0
        self.discarded = 0

    def reserve(self, n: int) -> np.ndarray:
        """Rows for up to ``n`` records (fewer at a chunk's end or at ``max_records``; none when full)."""
        n = min(int(n), self.max_records - self.n_records)
        if n <= 0:
            return _NO_ROWS
        if not self._chunks or self._fill == len(self._chunks[-1]):
            self._chunks.append(self._spare.pop() if self._spare else
                                _in_pages((self.chunk_records, WORDS_PER_RECORD), np.uint64))
            self._fill = 0
        last = self._chunks[-1]
        return last[self._fill:self._fill + min(n, len(last) - self._fill)]

    def append(self, words: np.ndarray) -> None:
        """Copy rows of 9 words in (what does not fit in ``max_records`` is counted as discarded)."""
        at = 0
        while at < len(words):
            dst = self.reserve(len(words) - at)
            if not len(dst):
                break
            dst[:] = words[at:at + len(dst)]
            self.commit(len(dst))
            at += len(dst)
        self.count_discarded(len(words) - at)

    def commit(self, n: int) -> None:
        """The first ``n`` reserved rows now hold records."""
        self._fill += n
        self.n_records += n

    def count_discarded(self, n: int) -> None:
        self.discarded += max(0, int(n))

    def mark(self) -> tuple[int, int]:
        return len(self._chunks), self._fill

    def rewind(self, mark: tuple[int, int]) -> None:
        """Forget rows committed since ``mark`` (a buffer that turned out to need the walk)."""
        n_chunks, fill = mark
        while len(self._chunks) > n_chunks:
            self._spare.append(self._chunks.pop())
        self._fill = fill
        self.n_records = (len(self._chunks) - 1) * self.chunk_records + fill if self._chunks else 0

    def _filled(self) -> list[np.ndarray]:
        return [c if i < len(self._chunks) - 1 else c[: self._fill] for i, c in enumerate(self._chunks)]

    def correlation_ids(self) -> np.ndarray:
        parts = [c.view(np.uint32)[:, _U32["correlation_id"]] for c in self._filled()]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def has_all(self, correlation_ids: np.ndarray) -> bool:
        """Whether every one of ``correlation_ids`` has records here (a window's launches came back)."""
        if not len(correlation_ids):
            return True
        return self.n_records > 0 and bool(np.isin(correlation_ids, self.correlation_ids()).all())

    def columns(self, pause: Optional[Callable[[], None]] = None,
                names: Optional["NameTable"] = None,
                arena: Optional["ColumnArena"] = None) -> tuple[KernelColumns, Optional[np.ndarray]]:
        """The window's records as columns, chunk by chunk (``pause`` runs between chunks: the
        collector yields the GIL there, so a 2M-record capture is ~120 short holds), and with
        ``names`` each record's name id in this window (NameTable.ids; else None). With ``arena``
        the columns are its arrays (valid until the arena's next use), else fresh ones."""
        n = self.n_records
        got = arena.get(n) if arena is not None else None
        cols, name_id = got if got is not None else (KernelColumns(*(_fresh(n, t) for t in _DTYPES)),
                                                     _fresh(n, np.int32))
        if names is None:
            name_id = None
        nat = self.native
        at = 0
        for i, c in enumerate(self._filled()):
            if i and pause is not None:
                pause()
            b = at + len(c)
            if nat is not None:
                nid = name_id[at:b] if name_id is not None else None
                misses = nat.columns(c, _AT64, _AT32, tuple(getattr(cols, k)[at:b] for k in COLUMNS), nid, names)
                if misses and nid is not None:  # pointers the hash table missed: new ones, or one that lost its slot
                    m = np.flatnonzero(nid < 0)
                    nid[m] = names.ids(cols.name_ptr[at:b][m])
            else:
                i64, u32 = c.view(np.int64), c.view(np.uint32)
                cols.start_ns[at:b] = i64[:, _AT["start"]]
                cols.end_ns[at:b] = i64[:, _AT["end"]]
                cols.stream[at:b] = u32[:, _U32["stream_id"]]
                cols.device[at:b] = u32[:, _U32["device_id"]]
                cols.graph_id[at:b] = u32[:, _U32["graph_id"]]
                cols.graph_node_id[at:b] = i64[:, _AT["graph_node_id"]]
                cols.correlation_id[at:b] = u32[:, _U32["correlation_id"]]
                cols.name_ptr[at:b] = c[:, _AT["name_ptr"]]
                if name_id is not None:
                    name_id[at:b] = names.ids(cols.name_ptr[at:b])
            at = b
        return cols, name_id

    def take(self, pause: Optional[Callable[[], None]] = None,
             names: Optional["NameTable"] = None,
             arena: Optional["ColumnArena"] = None) -> tuple[KernelColumns, Optional[np.ndarray]]:
        """columns(), then empty for the next window (up to KEEP_CHUNKS chunks kept for reuse)."""
        out = self.columns(pause, names, arena)
        self.clear(pause)
        return out

    def clear(self, pause: Optional[Callable[[], None]] = None) -> None:
        """Empty for the next window. Chunks beyond KEEP_CHUNKS (a capture's) are freed 4 at a
        time, ``pause`` between: freeing 150 MB at once held the GIL ~25 ms (munmap)."""
        self._spare.extend(self._chunks)
        self._chunks, self._fill, self.n_records, self.discarded = [], 0, 0, 0
        while len(self._spare) > KEEP_CHUNKS:
            del self._spare[max(KEEP_CHUNKS, len(self._spare) - 4):]
            if pause is not None and len(self._spare) > KEEP_CHUNKS:
                pause()


ARENA_KEEP_RECORDS = 1 << 16  # an arena keeps room for this many records between windows (4.5 MB)


class ColumnArena:
    """Column arrays reused from window to window, for a consumer that copies the columns before
    the next window (the light collector's link encodes them at once). Fresh arrays for every
    window cost more in page faults than the copy into them (a 20k-record window: 0.66 ms
    against 0.14 ms on the CPU machine). Bounded: a larger window (an on-demand capture) gets
    fresh arrays, so the arena never holds (or has to give back) a capture's memory."""

    def __init__(self, max_records: int = ARENA_KEEP_RECORDS) -> None:
        self.max_records = int(max_records)
        self._cap = 0
        self._cols: Optional[KernelColumns] = None
        self._name_id = np.zeros(0, np.int32)

    def get(self, n: int) -> Optional[tuple[KernelColumns, np.ndarray]]:
        """Columns for ``n`` records, valid until the next get(); None above ``max_records``."""
        if n > self.max_records:
            return None
        if n > self._cap or self._cols is None:
            self._cap = min(max(n * 2, 1024), self.max_records)
            self._cols = KernelColumns(*(np.empty(self._cap, t) for t in _DTYPES))
            self._name_id = np.empty(self._cap, np.int32)
        c = self._cols
        return KernelColumns(*(getattr(c, k)[:n] for k in COLUMNS)), self._name_id[:n]


class NameTable:
    """Kernel name pointers -> name ids of the current window, vectorised.

    CUPTI shares one name string among every record of a kernel, so a process has few distinct
    pointers: each is read once and gets a process-wide id. A window's pointers are mapped
    through a direct-mapped hash table of the known ones (``_rehash``), with a binary search over
    them (kept sorted) for the few it misses (no per-record Python, no sort of the window; a new
    pointer costs one read). Different pointers with the same text share an id."""

    def __init__(self, read: Callable[[int], str]) -> None:
        self._read = read
        self._ptrs = np.zeros(0, np.uint64)  # sorted known pointers
        self._gid = np.zeros(0, np.int64)  # process-wide name id of each
        self._gnames: list[str] = []
        self._gindex: dict[str, int] = {}
        self._rehash()
        self.new_window()

    def new_window(self) -> None:
        self.names: list[str] = []  # the window's names, by window id
        self._win_of = np.full(len(self._gnames), -1, np.int32)  # process-wide id -> window id

    def _learn(self, new_ptrs: np.ndarray) -> None:
        gids = []
        for p in new_ptrs.tolist():
            s = self._read(p)
            g = self._gindex.get(s)
            if g is None:
                g = self._gindex[s] = len(self._gnames)
                self._gnames.append(s)
            gids.append(g)
        ptrs = np.concatenate([self._ptrs, new_ptrs.astype(np.uint64)])
        gid = np.concatenate([self._gid, np.asarray(gids, np.int64)])
        order = np.argsort(ptrs, kind="stable")
        self._ptrs, self._gid = ptrs[order], gid[order]
        self._rehash()
        if len(self._win_of) < len(self._gnames):
            self._win_of = np.concatenate([self._win_of, np.full(len(self._gnames) - len(self._win_of), -1, np.int32)])

    def _rehash(self) -> None:
        """A direct-mapped table of the known pointers (8+ slots each): one multiply-shift, one
        gather and one compare per record, 5x faster than a binary search over them (whose
        branches mispredict: ~30 ns a record). Two pointers in one slot: the one left out is
        found by the binary search, like a new pointer."""
        bits = max(10, int(np.ceil(np.log2(max(1, len(self._ptrs)) * 8))))
        self._shift = np.uint64(64 - bits)
        slot = self._slot(self._ptrs)
        self._hptr = np.full(1 << bits, _NO_PTR, np.uint64)
        self._hgid = np.zeros(1 << bits, np.int64)
        self._hptr[slot] = self._ptrs
        self._hgid[slot] = self._gid

    def table(self) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """What the C pass looks names up in: the hash table's pointers and process-wide ids,
        its shift, and the window id of each process-wide id (-1: not in this window yet)."""
        return self._hptr, self._hgid, int(self._shift), self._win_of

    def add_window_names(self, gids: np.ndarray) -> None:
        """Names the C pass numbered into this window (``_win_of``), in order."""
        gn = self._gnames
        self.names.extend([gn[i] for i in gids.tolist()])

    def _slot(self, name_ptr: np.ndarray) -> np.ndarray:
        return ((name_ptr >> _FOUR) * _GOLDEN) >> self._shift

    def _lookup(self, name_ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self._ptrs):
            return np.zeros(len(name_ptr), np.intp), np.zeros(len(name_ptr), bool)
        idx = np.minimum(np.searchsorted(self._ptrs, name_ptr), len(self._ptrs) - 1)
        return idx, self._ptrs[idx] == name_ptr

    def ids(self, name_ptr: np.ndarray) -> np.ndarray:
        if not len(name_ptr):
            return np.zeros(0, np.int32)
        name_ptr = name_ptr.astype(np.uint64, copy=False)
        slot = self._slot(name_ptr)
        hit = self._hptr[slot] == name_ptr
        g = self._hgid[slot]
        if not hit.all():  # new pointers, or one that lost its slot: the binary search
            miss = np.flatnonzero(~hit)
            idx, found = self._lookup(name_ptr[miss])
            if not found.all():
                self._learn(np.unique(name_ptr[miss][~found]))
                idx, found = self._lookup(name_ptr[miss])
            g[miss] = self._gid[idx]
        w = self._win_of[g]
        miss = w < 0
        if miss.any():  # names new to this window: ids in order of process-wide id, in one go
            present = np.zeros(len(self._gnames), bool)  # (a mark per known name: no sort of the records)
            present[g[miss]] = True
            new = np.flatnonzero(present)
            self._win_of[new] = np.arange(len(self.names), len(self.names) + len(new), dtype=np.int32)
            gn = self._gnames
            self.names.extend([gn[i] for i in new.tolist()])
            w = self._win_of[g]
        return w


_SHARED_NAMES: dict = {}


def shared_name_table(key, read: Callable[[int], str]) -> NameTable:
    """The process's NameTable for one libcupti (``key``): kernel-name pointers stay valid while
    it is loaded (graphmon never finalizes CUPTI), so a detach and a later attach keep the names
    read so far instead of reading hundreds again in their first window (an HF compiled decode:
    ~0.6 ms of the collector's GIL on the H200). ``key`` None: a table of its own."""
    if key is None:
        return NameTable(read)
    table = _SHARED_NAMES.get(key)
    if table is None:
        table = _SHARED_NAMES[key] = NameTable(read)
    return table


def warm_up(record_bytes: int = 248) -> None:
    """Run the decode path once on a synthetic two-record buffer, at attach: numpy's first calls
    (np.unique's first call: 8 ms on the CPU machine) and lazy imports then happen off the
    window. Seen on the H200: a fresh process's first window spent 80 ms of CPU in decode
    (a 63 ms host step) and the next ones 1.3-2 ms."""
    rec = np.zeros((2, record_bytes), np.uint8)
    for i in range(2):
        rec[i, 0:4] = np.array([KIND_CONCURRENT_KERNEL], "<u4").view(np.uint8)
        rec[i, 104:112] = np.array([0x1000 + i], "<u8").view(np.uint8)
    data = rec.reshape(-1)
    dec = BufferDecoder(walk=lambda d: np.arange(0, len(d) - record_bytes + 1, record_bytes, dtype=np.int64))
    names = NameTable(lambda p: "")
    store = RecordStore(16, native=dec.native)
    for _ in range(2):
        dec.gather(data, store)
    store.has_all(np.array([0, 1], np.int64))
    store.take(lambda: None, names)
