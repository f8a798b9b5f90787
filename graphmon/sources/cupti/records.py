"""CUPTI activity buffers -> numpy columns, with no Python object per record.

A buffer holds CUpti_ActivityKernel records back to back (8-byte aligned). Their size depends
on libcupti (CUpti_ActivityKernel10: 216 bytes in CUPTI 13.0, CUpti_ActivityKernel13: 248 bytes
in 13.4), but the fields graphmon reads sit at the same offsets in every version since
Kernel5 (cupti_activity.h). So the decoder views a buffer as a structured array whose itemsize
is the record size *measured at runtime* (the distance between the first records libcupti's
own walker returns), checks every record's kind, and copies the columns out. Anything
unexpected (another kind, a size that does not divide the buffer) takes the fallback path: walk
the records one by one with libcupti's walker and gather the kernel ones (counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

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
# The 8-byte words (byte offset // 8) that hold them: kind (low half of word 0), start, end,
# device_id (low half of 5), stream_id (low half of 6), correlation_id (high half of 11),
# name_ptr, graph_node_id, graph_id (high half of 19). Little-endian, like every CUDA host.
_WORDS = np.array((0, 2, 3, 5, 6, 11, 13, 18, 19), np.intp)
_LO32, _HI32 = np.uint64(0xFFFF_FFFF), np.uint64(32)
PROBE_BYTES = 2048  # the first records of a buffer, walked to measure the record size
MIN_KERNEL_RECORD_BYTES = 160  # the fields above end at 160 (CUpti_ActivityKernel5's size)
KNOWN_RECORD_BYTES = {216: "CUpti_ActivityKernel10 (CUPTI 13.0)", 248: "CUpti_ActivityKernel13 (CUPTI 13.4)"}

COLUMNS = ("start_ns", "end_ns", "stream", "device", "graph_id", "graph_node_id", "correlation_id", "name_ptr")
_DTYPES = (np.int64, np.int64, np.int64, np.int32, np.int64, np.int64, np.int64, np.uint64)
_SOURCE = ("start", "end", "stream_id", "device_id", "graph_id", "graph_node_id", "correlation_id", "name_ptr")


def kernel_dtype(record_bytes: int) -> np.dtype:
    """The fields graphmon reads, as a structured dtype of one record of ``record_bytes``."""
    names, formats, offsets = zip(*KERNEL_FIELDS)
    return np.dtype({"names": list(names), "formats": list(formats), "offsets": list(offsets),
                     "itemsize": int(record_bytes)})


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
    def from_records(cls, rec: np.ndarray) -> "KernelColumns":
        return cls(*(rec[s].astype(t) for s, t in zip(_SOURCE, _DTYPES)))

    @classmethod
    def empty(cls) -> "KernelColumns":
        return cls(*(np.zeros(0, t) for t in _DTYPES))

    @classmethod
    def concat(cls, parts: list["KernelColumns"], pause: Optional[Callable[[], None]] = None) -> "KernelColumns":
        """One array per column. The copy is cut into pieces of at most ``CONCAT_PIECE_RECORDS``
        records and ``pause`` runs between pieces (the collector yields the GIL there: a 2M-record
        capture is ~30 short holds, not 8 holds of several ms each)."""
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(*concat_columns([[getattr(p, c) for c in COLUMNS] for p in parts], pause))

    def head(self, n: int) -> "KernelColumns":
        return KernelColumns(*(getattr(self, c)[:n] for c in COLUMNS))

    def take(self, mask: np.ndarray) -> "KernelColumns":
        return KernelColumns(*(getattr(self, c)[mask] for c in COLUMNS))


CONCAT_PIECE_RECORDS = 1 << 14  # records copied per GIL hold when a window's buffers are joined (~1 MB)


def concat_columns(parts: list[list[np.ndarray]], pause: Optional[Callable[[], None]] = None,
                   piece_records: int = CONCAT_PIECE_RECORDS) -> list[np.ndarray]:
    """Join ``parts`` (each a list of same-length columns, the same dtypes in every part) column by
    column into preallocated arrays, calling ``pause`` after every ``piece_records`` records copied
    (np.concatenate would copy a whole column in one GIL hold)."""
    total = sum(len(p[0]) for p in parts)
    out = [np.empty(total, a.dtype) for a in parts[0]]
    at = copied = 0
    for p in parts:
        n = len(p[0])
        for o, a in zip(out, p):
            o[at:at + n] = a
        at += n
        copied += n
        if pause is not None and copied >= piece_records and at < total:
            pause()
            copied = 0
    return out


@dataclass
class DecodeStats:
    buffers: int = 0
    records: int = 0
    fallback_buffers: int = 0  # buffers walked record by record
    fallback_records: int = 0
    other_kind_records: int = 0  # records of a kind graphmon did not ask for (skipped, counted)
    record_bytes: int = 0  # measured stride of kernel records; 0 until measured


@dataclass
class BufferDecoder:
    """Decodes one buffer per call. ``walk(data) -> offsets`` is libcupti's record walker."""

    walk: Callable[[np.ndarray], np.ndarray]
    record_bytes: int = 0  # 0: measure on the first buffer holding two kernel records
    stats: DecodeStats = field(default_factory=DecodeStats)
    _scratch: Optional[np.ndarray] = field(default=None, repr=False)  # (records, 9) words of the buffer being decoded

    def decode(self, data: np.ndarray) -> KernelColumns:
        st = self.stats
        st.buffers += 1
        n_bytes = len(data)
        if not self.record_bytes and n_bytes:
            self._measure(data)
        rb = self.record_bytes
        if rb >= MIN_KERNEL_RECORD_BYTES and rb % 8 == 0 and n_bytes and n_bytes % rb == 0:
            n = n_bytes // rb
            if data.ctypes.data % 8 == 0:
                return self._words(data, n)
            rec = np.frombuffer(data, kernel_dtype(rb), count=n)  # unaligned (never from CUPTI's pool)
            if (rec["kind"] == KIND_CONCURRENT_KERNEL).all():
                st.records += n
                return KernelColumns.from_records(rec)
        return self._walk(data) if n_bytes else KernelColumns.empty()

    def _words(self, data: np.ndarray, n: int) -> KernelColumns:
        """The fast path: every field graphmon reads sits in one of 9 aligned 8-byte words of a
        record (``_WORDS``), so one gather reads each record once (the buffer was written by
        CUPTI's thread: it is cold here) into a compact (n, 9) block reused from buffer to buffer,
        and each column is copied out of it (or a mask/shift of one). Measured on 1 MB buffers not in cache: 121 us against
        227 us for per-field structured gathers and 138 us for a 160-byte-per-record copy first."""
        rb = self.record_bytes
        if self._scratch is None or len(self._scratch) < n:
            self._scratch = np.empty((n, len(_WORDS)), np.uint64)
        words = self._scratch[:n]  # reused: a fresh 300 KB block per buffer is mmap'd and page-faulted
        np.take(np.frombuffer(data, np.uint64, count=n * rb // 8).reshape(n, rb // 8), _WORDS, axis=1, out=words)
        if not ((words[:, 0] & _LO32) == KIND_CONCURRENT_KERNEL).all():
            return self._walk(data)
        self.stats.records += n
        i = words.view(np.int64)
        return KernelColumns(start_ns=i[:, 1].copy(), end_ns=i[:, 2].copy(), stream=(words[:, 4] & _LO32).view(np.int64),
                             device=(words[:, 3] & _LO32).astype(np.int32), graph_id=(words[:, 8] >> _HI32).view(np.int64),
                             graph_node_id=i[:, 7].copy(), correlation_id=(words[:, 5] >> _HI32).view(np.int64),
                             name_ptr=words[:, 6].copy())

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

    def _walk(self, data: np.ndarray) -> KernelColumns:
        st = self.stats
        offs = np.asarray(self.walk(data), np.int64)
        if not len(offs):
            return KernelColumns.empty()
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
        block = data[k[:, None] + np.arange(MIN_KERNEL_RECORD_BYTES)]  # (n, 160) copy: one row per record
        return KernelColumns.from_records(block.view(kernel_dtype(MIN_KERNEL_RECORD_BYTES)).reshape(-1))


@dataclass
class RecordStore:
    """The window's decoded columns, bounded by ``max_records`` (the rest counted as discarded).
    Only the collector thread touches it: CUPTI's callbacks never wait on it."""

    max_records: int
    parts: list[KernelColumns] = field(default_factory=list)
    n_records: int = 0
    discarded: int = 0

    def add(self, cols: KernelColumns) -> None:
        room = self.max_records - self.n_records
        if len(cols) > room:
            self.discarded += len(cols) - max(room, 0)
            cols = cols.head(max(room, 0))
        if len(cols):
            self.parts.append(cols)
            self.n_records += len(cols)

    def has_all(self, correlation_ids: np.ndarray) -> bool:
        """Whether every one of ``correlation_ids`` has records here (a window's launches came back)."""
        if not len(correlation_ids):
            return True
        return bool(self.parts) and bool(np.isin(correlation_ids, np.concatenate([p.correlation_id for p in self.parts])).all())

    def take(self, pause: Optional[Callable[[], None]] = None) -> KernelColumns:
        out = KernelColumns.concat(self.parts, pause)
        self.parts, self.n_records = [], 0
        return out


class NameTable:
    """Kernel name pointers -> name ids of the current window, vectorised.

    CUPTI shares one name string among every record of a kernel, so a process has few distinct
    pointers: they are kept sorted with a process-wide id each (each pointer read once), and a
    buffer's pointers are mapped with one searchsorted (no per-record Python, no sort of the
    buffer; a new pointer costs one read). Different pointers with the same text share an id."""

    def __init__(self, read: Callable[[int], str]) -> None:
        self._read = read
        self._ptrs = np.zeros(0, np.uint64)  # sorted known pointers
        self._gid = np.zeros(0, np.int64)  # process-wide name id of each
        self._gnames: list[str] = []
        self._gindex: dict[str, int] = {}
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
        if len(self._win_of) < len(self._gnames):
            self._win_of = np.concatenate([self._win_of, np.full(len(self._gnames) - len(self._win_of), -1, np.int32)])

    def _lookup(self, name_ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self._ptrs):
            return np.zeros(len(name_ptr), np.intp), np.zeros(len(name_ptr), bool)
        idx = np.minimum(np.searchsorted(self._ptrs, name_ptr), len(self._ptrs) - 1)
        return idx, self._ptrs[idx] == name_ptr

    def ids(self, name_ptr: np.ndarray) -> np.ndarray:
        if not len(name_ptr):
            return np.zeros(0, np.int32)
        name_ptr = name_ptr.astype(np.uint64, copy=False)
        idx, hit = self._lookup(name_ptr)
        if not hit.all():
            self._learn(np.unique(name_ptr[~hit]))
            idx, hit = self._lookup(name_ptr)
        g = self._gid[idx]
        w = self._win_of[g]
        miss = w < 0
        if miss.any():  # names new to this window: ids in order of first process-wide id, in one go
            new = np.unique(g[miss])
            self._win_of[new] = np.arange(len(self.names), len(self.names) + len(new), dtype=np.int32)
            gn = self._gnames
            self.names.extend([gn[i] for i in new.tolist()])
            w = self._win_of[g]
        return w


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
    store = RecordStore(16)
    for _ in range(2):
        cols = dec.decode(data)
        store.add(cols)
        names.ids(cols.name_ptr)
    store.take(lambda: None)
    concat_columns([[np.zeros(1, np.int32)], [np.zeros(1, np.int32)]])

