/* graphmon's native decode pass: CUPTI kernel activity records -> graphmon's rows and columns.

   Why by hand: records.py does the same with numpy, one array operation per field (a gather,
   a kind check, 8 strided copies, a hashed name lookup); each is a pass over the window and a
   call, so it tops out at 7-10 M records/s on the H200's CPU, holding the GIL throughout. Here
   each record is read once and each column written once, and ctypes releases the GIL for the
   call: the host's threads run while graphmon decodes.

   Plain C with no Python API and no libc call, loaded with ctypes (native.py): one build works
   for every Python version. records.py stays the reference and the fallback; tests check that
   both give identical rows, columns and name ids. */
#include <stdint.h>

#define GM_EXPORT __attribute__((visibility("default")))

/* Copy the words ``words[0..n_words)`` of each of ``n`` records (``stride_words`` 8-byte words
   apart, starting at ``buf``) into ``out`` (n rows of n_words). Word 0's low half is the
   record's kind: at the first record whose kind is not ``kind`` stop and return -1 - its index
   (the caller walks that buffer record by record instead). Else return n. */
GM_EXPORT int64_t gm_gather(const uint64_t *buf, int64_t n, int64_t stride_words, const int64_t *words,
                            int64_t n_words, uint64_t *out, uint32_t kind) {
    for (int64_t i = 0; i < n; i++) {
        const uint64_t *rec = buf + i * stride_words;
        if ((uint32_t)rec[0] != kind) return -1 - i;
        uint64_t *row = out + i * n_words;
        for (int64_t w = 0; w < n_words; w++) row[w] = rec[words[w]];
    }
    return n;
}

/* Rows of ``row_words`` words -> the 8 columns of records.COLUMNS, and each record's name id
   for the current window. ``at64``: the row positions of start, end, graph_node_id and name_ptr
   (64-bit words); ``at32``: the positions of stream_id, device_id, graph_id and correlation_id
   in the row's uint32 view (little-endian halves).

   Name ids (``name_id`` NULL: none): NameTable's direct-mapped table (``hptr``/``hgid``, slot =
   ((ptr >> 4) * golden) >> shift) gives the process-wide id g, ``win_of[g]`` its id in this
   window. Names new to this window get the next window ids (``*n_names`` on), in order of g as
   NameTable.ids gives them; their g go to ``new_gids`` and ``*n_new``. A record whose pointer
   misses the table gets -1: the caller resolves those with NameTable.ids (a new pointer, or one
   that lost its slot: rare after a process's first windows). Returns the number of -1s. */
GM_EXPORT int64_t gm_columns(const uint64_t *rows, int64_t n, int64_t row_words, const int64_t *at64,
                             const int64_t *at32, int64_t *start_ns, int64_t *end_ns, int64_t *stream,
                             int32_t *device, int64_t *graph_id, int64_t *graph_node_id, int64_t *correlation_id,
                             uint64_t *name_ptr, int32_t *name_id, const uint64_t *hptr, const int64_t *hgid,
                             int64_t shift, int32_t *win_of, int64_t n_win_of, int64_t *new_gids, int64_t *counts) {
    const uint64_t golden = 0x9E3779B97F4A7C15ull;
    int64_t misses = 0, fresh = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t *row = rows + i * row_words;
        const uint32_t *half = (const uint32_t *)row;
        start_ns[i] = (int64_t)row[at64[0]];
        end_ns[i] = (int64_t)row[at64[1]];
        graph_node_id[i] = (int64_t)row[at64[2]];
        uint64_t p = row[at64[3]];
        name_ptr[i] = p;
        stream[i] = half[at32[0]];
        device[i] = (int32_t)half[at32[1]];
        graph_id[i] = half[at32[2]];
        correlation_id[i] = half[at32[3]];
        if (name_id) {  /* first the process-wide id (or -1); window ids below */
            uint64_t slot = ((p >> 4) * golden) >> shift;
            int64_t g = hptr[slot] == p ? hgid[slot] : -1;
            if (g < 0 || g >= n_win_of) {
                name_id[i] = -1;
                misses++;
                continue;
            }
            name_id[i] = (int32_t)g;
            if (win_of[g] == -1) {
                win_of[g] = -2; /* new to this window: numbered below, in order of g */
                fresh++;
            }
        }
    }
    if (!name_id) return 0;
    counts[1] = 0;
    if (fresh) {
        int64_t next = counts[0], k = 0;
        for (int64_t g = 0; g < n_win_of; g++)
            if (win_of[g] == -2) {
                win_of[g] = (int32_t)next++;
                new_gids[k++] = g;
            }
        counts[0] = next;
        counts[1] = k;
    }
    for (int64_t i = 0; i < n; i++)
        if (name_id[i] >= 0) name_id[i] = win_of[name_id[i]];
    return misses;
}
