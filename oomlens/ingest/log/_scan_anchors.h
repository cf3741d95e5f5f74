/* The anchor table and its two searches, for _scan.c (one translation unit: included once,
 * after its constants and Vec). */
#ifndef OOMLENS_SCAN_ANCHORS_H
#define OOMLENS_SCAN_ANCHORS_H

/* ---- the anchor matcher: leftmost-first, non-overlapping, as ahocorasick_rs's LeftmostFirst */

#define HASH_BITS 16
typedef struct {
    Py_ssize_t count;
    uint8_t **text;
    Py_ssize_t *len;
    int64_t *bits;
    uint8_t filter[1 << (HASH_BITS - 3)]; /* one bit per hash of an anchor's first 4 bytes */
    int32_t *bucket_start;                /* (1 << HASH_BITS) + 1 offsets into bucket */
    int32_t *bucket;                      /* anchor indices, ascending within a bucket */
    /* the pivot search: each anchor's pivot, two adjacent bytes at offset pivot[a] chosen rare
     * in logs; sixteen offsets at a time are tested for a first pivot byte followed by a second
     * (nibble tables, SSSE3), then the pair itself, then the anchors that have that pair.
     * Measured per 4 MiB batch: 6 ms dense, 5 ms sparse; the hash filter alone 10 and 8 ms;
     * three-byte pivots let more offsets through (their bytes' sets are as wide) */
    int32_t *pivot;
    uint8_t first_nibbles[16], second_nibbles[16];
    uint8_t pair_filter[1 << 13];
    int32_t *pair_start; /* 65536 + 1 offsets into pair_list */
    int32_t *pair_list;  /* anchor indices, ascending within a pair */
    int pivots_usable;   /* every pivot byte is ASCII */
    int32_t max_pivot;   /* the largest pivot: an occurrence whose pivot is at p starts at or
                          * after p - max_pivot */
} Matcher;

static inline uint32_t load4(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint32_t hash4(uint32_t v) { return (v * 2654435761u) >> (32 - HASH_BITS); }

static void matcher_free(PyObject *capsule) {
    Matcher *m = PyCapsule_GetPointer(capsule, "oomlens.matcher");
    if (m == NULL) return;
    for (Py_ssize_t i = 0; i < m->count; i++) free(m->text[i]);
    free(m->text);
    free(m->len);
    free(m->bits);
    free(m->bucket_start);
    free(m->bucket);
    free(m->pivot);
    free(m->pair_start);
    free(m->pair_list);
    free(m);
}

static PyObject *make_matcher(PyObject *self, PyObject *args) {
    PyObject *anchors, *bits, *pivots;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &anchors, &PyTuple_Type, &bits,
                          &PyTuple_Type, &pivots))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(anchors);
    if (PyTuple_GET_SIZE(bits) != n || PyTuple_GET_SIZE(pivots) != n) {
        PyErr_SetString(PyExc_ValueError, "one kind of line and one pivot per anchor");
        return NULL;
    }
    Matcher *m = calloc(1, sizeof(Matcher));
    if (m == NULL) return PyErr_NoMemory();
    m->count = n;
    m->text = calloc(n ? n : 1, sizeof(uint8_t *));
    m->len = calloc(n ? n : 1, sizeof(Py_ssize_t));
    m->bits = calloc(n ? n : 1, sizeof(int64_t));
    m->bucket_start = calloc((1 << HASH_BITS) + 1, sizeof(int32_t));
    m->bucket = calloc(n ? n : 1, sizeof(int32_t));
    m->pivot = calloc(n ? n : 1, sizeof(int32_t));
    m->pair_start = calloc((1 << 16) + 1, sizeof(int32_t));
    m->pair_list = calloc(n ? n : 1, sizeof(int32_t));
    PyObject *capsule = PyCapsule_New(m, "oomlens.matcher", matcher_free);
    if (capsule == NULL) {
        free(m);
        return NULL;
    }
    if (!m->text || !m->len || !m->bits || !m->bucket_start || !m->bucket || !m->pivot ||
        !m->pair_start || !m->pair_list) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    uint32_t *hashes = calloc(n ? n : 1, sizeof(uint32_t));
    if (hashes == NULL) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(anchors, i);
        if (!PyBytes_Check(a) || PyBytes_GET_SIZE(a) < 4 ||
            memchr(PyBytes_AS_STRING(a), '\n', PyBytes_GET_SIZE(a)) != NULL) {
            free(hashes);
            Py_DECREF(capsule);
            PyErr_SetString(PyExc_ValueError, "anchors are bytes of 4 or more, without a newline");
            return NULL;
        }
        m->len[i] = PyBytes_GET_SIZE(a);
        m->text[i] = malloc(m->len[i]);
        if (m->text[i] == NULL) {
            free(hashes);
            Py_DECREF(capsule);
            return PyErr_NoMemory();
        }
        memcpy(m->text[i], PyBytes_AS_STRING(a), m->len[i]);
        m->bits[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(bits, i));
        if (m->bits[i] == -1 && PyErr_Occurred()) {
            free(hashes);
            Py_DECREF(capsule);
            return NULL;
        }
        long pivot = PyLong_AsLong(PyTuple_GET_ITEM(pivots, i));
        if (pivot < 0 || pivot > m->len[i] - 2) {
            free(hashes);
            Py_DECREF(capsule);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a pivot inside its anchor");
            return NULL;
        }
        m->pivot[i] = (int32_t)pivot;
        if (pivot > m->max_pivot) m->max_pivot = (int32_t)pivot;
        hashes[i] = hash4(load4(m->text[i]));
        m->filter[hashes[i] >> 3] |= (uint8_t)(1u << (hashes[i] & 7));
        m->bucket_start[hashes[i] + 1]++;
    }
    for (int h = 0; h < (1 << HASH_BITS); h++) m->bucket_start[h + 1] += m->bucket_start[h];
    int32_t *fill = calloc(1 << HASH_BITS, sizeof(int32_t));
    if (fill == NULL) {
        free(hashes);
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t h = hashes[i];
        m->bucket[m->bucket_start[h] + fill[h]++] = (int32_t)i;
    }
    free(fill);
    free(hashes);
    /* the pivot pairs: a bitmap, the anchors of each pair, and the nibble tables of the first
     * and second bytes (for byte b = 16 h + l below 128, bit h of table[l]) */
    m->pivots_usable = 1;
    int32_t *pair_fill = calloc(1 << 16, sizeof(int32_t));
    if (pair_fill == NULL) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t b0 = m->text[i][m->pivot[i]], b1 = m->text[i][m->pivot[i] + 1];
        if (b0 >= 128 || b1 >= 128) m->pivots_usable = 0;
        uint32_t pair = b0 | (uint32_t)b1 << 8;
        m->pair_filter[pair >> 3] |= (uint8_t)(1u << (pair & 7));
        m->pair_start[pair + 1]++;
        m->first_nibbles[b0 & 15] |= (uint8_t)(1u << ((b0 >> 4) & 7));
        m->second_nibbles[b1 & 15] |= (uint8_t)(1u << ((b1 >> 4) & 7));
    }
    for (int h = 0; h < (1 << 16); h++) m->pair_start[h + 1] += m->pair_start[h];
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t pair = m->text[i][m->pivot[i]] | (uint32_t)m->text[i][m->pivot[i] + 1] << 8;
        m->pair_list[m->pair_start[pair] + pair_fill[pair]++] = (int32_t)i;
    }
    free(pair_fill);
    return capsule;
}

/* ---- the anchor search */

/* Leftmost-first on the hash filter: at each offset the first anchor (in the table's order)
 * that starts there; on after its end. */
static int search_hashed(const Matcher *m, const uint8_t *d, Py_ssize_t n, Vec *offsets,
                         Vec *bits) {
#define PASSES(at) (m->filter[hash4(load4(d + (at))) >> 3] & (1u << (hash4(load4(d + (at))) & 7)))
    for (Py_ssize_t i = 0; i + 4 <= n;) {
        /* eight offsets at a time through the filter: one branch for all when none passes */
        if (i + 11 <= n && !(PASSES(i) | PASSES(i + 1) | PASSES(i + 2) | PASSES(i + 3) |
                             PASSES(i + 4) | PASSES(i + 5) | PASSES(i + 6) | PASSES(i + 7))) {
            i += 8;
            continue;
        }
#undef PASSES
        uint32_t h = hash4(load4(d + i));
        if (!(m->filter[h >> 3] & (1u << (h & 7)))) {
            i++;
            continue;
        }
        Py_ssize_t found = -1;
        for (int32_t k = m->bucket_start[h]; k < m->bucket_start[h + 1]; k++) {
            int32_t a = m->bucket[k];
            if (m->len[a] <= n - i && memcmp(d + i, m->text[a], m->len[a]) == 0) {
                found = a;
                break;
            }
        }
        if (found < 0) {
            i++;
            continue;
        }
        if (vec_push(offsets, i) < 0 || vec_push(bits, m->bits[found]) < 0) return -1;
        i += m->len[found];
    }
    return 0;
}

/* ---- line tails seen before (the pivot search's memo)
 *
 * Logs repeat long lines whose ends are the same text: ZeRO-3's cache-flush warning is 560
 * bytes, 470 of them the same on every rank and step, and most of a dense log's bytes.  The
 * occurrences whose pivot lies at or past an occurrence's start s plus the largest pivot start
 * at or after s, and (anchors hold no newline) end before the line's newline nl: they are
 * fixed by the bytes from s to nl.  So, per anchor, the last such tail [s, nl] is kept with
 * those occurrences; a line whose tail after an occurrence of that anchor is the same bytes
 * takes them from the memo and the search goes on past its newline.  An anchor whose tails
 * differ (numbers, short lines) stops being tried after MEMO_MISSES misses in a row. */

#define MEMO_MIN 96          /* shorter tails are searched: the lookup would cost as much */
#define MEMO_MAX 4096        /* longer ones too: their copy is kept per anchor */
#define MEMO_MISSES 16
#define MEMO_PENDING 8       /* tails of one line recorded at its end, at most */

typedef struct {
    uint8_t *text; /* the tail, newline included */
    Py_ssize_t len;
    int64_t *occ; /* per occurrence: start - s, anchor, pivot position - s; in start order */
    Py_ssize_t nocc, cap;
    int misses;
} MemoEntry;

typedef struct {
    MemoEntry *entry; /* one per anchor */
    Py_ssize_t count;
} Memo;

static int memo_init(Memo *memo, const Matcher *m) {
    memo->count = m->count;
    memo->entry = calloc(m->count ? m->count : 1, sizeof(MemoEntry));
    return memo->entry == NULL ? -1 : 0;
}

static void memo_free(Memo *memo) {
    for (Py_ssize_t a = 0; memo->entry != NULL && a < memo->count; a++) {
        free(memo->entry[a].text);
        free(memo->entry[a].occ);
    }
    free(memo->entry);
    memo->entry = NULL;
}

/* Inserts occurrence (s, a) into starts/which, kept sorted by start, then anchor. */
static int push_occurrence(Vec *starts, Vec *which, Py_ssize_t s, int32_t a) {
    if (vec_push(starts, s) < 0 || vec_push(which, a) < 0) return -1;
    Py_ssize_t j = starts->n - 1;
    while (j > 0 && (starts->v[j - 1] > s || (starts->v[j - 1] == s && which->v[j - 1] > a))) {
        starts->v[j] = starts->v[j - 1];
        which->v[j] = which->v[j - 1];
        j--;
    }
    starts->v[j] = s;
    which->v[j] = a;
    return 0;
}

/* Keeps the tail [s, nl] of anchor a's occurrence at s with the occurrences found whose pivot
 * lies in [s + max_pivot, nl): all of them, once the search has passed nl. */
static int memo_record(const Matcher *m, Memo *memo, const uint8_t *d, Py_ssize_t s,
                       int32_t a, Py_ssize_t nl, const Vec *starts, const Vec *which) {
    MemoEntry *e = &memo->entry[a];
    Py_ssize_t len = nl - s + 1, first = starts->n;
    while (first > 0 && starts->v[first - 1] >= s) first--;
    uint8_t *text = realloc(e->text, len);
    if (text == NULL) return -1;
    e->text = text;
    memcpy(text, d + s, len);
    e->len = len;
    e->nocc = 0;
    for (Py_ssize_t k = first; k < starts->n; k++) {
        int32_t b = (int32_t)which->v[k];
        Py_ssize_t pivot_at = starts->v[k] + m->pivot[b];
        if (pivot_at < s + m->max_pivot || pivot_at >= nl) continue;
        if (e->nocc + 3 > e->cap) {
            Py_ssize_t cap = e->cap ? 2 * e->cap : 24;
            int64_t *occ = realloc(e->occ, cap * sizeof(int64_t));
            if (occ == NULL) {
                e->len = 0;
                return -1;
            }
            e->occ = occ;
            e->cap = cap;
        }
        e->occ[e->nocc++] = starts->v[k] - s;
        e->occ[e->nocc++] = b;
        e->occ[e->nocc++] = pivot_at - s;
    }
    return 0;
}

/* Every occurrence of the anchors whose pivot pair is at offset q, into (start, anchor)
 * pairs kept sorted by start, then anchor (occurrences come in pivot order, which is at most
 * an anchor's length from start order). */
static int occurrences_of(const Matcher *m, const uint8_t *d, Py_ssize_t n, Py_ssize_t q,
                          uint32_t pair, Vec *starts, Vec *which) {
    for (int32_t k = m->pair_start[pair]; k < m->pair_start[pair + 1]; k++) {
        int32_t a = m->pair_list[k];
        Py_ssize_t s = q - m->pivot[a];
        if (s < 0 || m->len[a] > n - s || memcmp(d + s, m->text[a], m->len[a]) != 0) continue;
        if (push_occurrence(starts, which, s, a) < 0) return -1;
    }
    return 0;
}

static inline int occurrences_at(const Matcher *m, const uint8_t *d, Py_ssize_t n, Py_ssize_t q,
                                 Vec *starts, Vec *which) {
    uint32_t pair = d[q] | (uint32_t)d[q + 1] << 8;
    if (!(m->pair_filter[pair >> 3] & (1u << (pair & 7)))) return 0;
    return occurrences_of(m, d, n, q, pair, starts, which);
}

#if defined(__x86_64__) || defined(__i386__)
#include <tmmintrin.h>
#define HAVE_PIVOT_SEARCH 1

__attribute__((target("ssse3"))) static inline __m128i in_set(__m128i v, __m128i table) {
    const __m128i low = _mm_set1_epi8(0x0f);
    /* bit h of a byte 16 h + l, none for h >= 8 (past ASCII) */
    const __m128i high_bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0, 0, 0, 0, 0);
    __m128i allowed = _mm_shuffle_epi8(table, _mm_and_si128(v, low));
    __m128i bit = _mm_shuffle_epi8(high_bit, _mm_and_si128(_mm_srli_epi16(v, 4), low));
    return _mm_cmpeq_epi8(_mm_and_si128(allowed, bit), _mm_setzero_si128());
}

__attribute__((target("ssse3"))) static int pivot_candidates(const Matcher *m, const uint8_t *d,
                                                             Py_ssize_t n, Vec *starts,
                                                             Vec *which, Memo *memo) {
    const __m128i first = _mm_loadu_si128((const __m128i *)m->first_nibbles);
    const __m128i second = _mm_loadu_si128((const __m128i *)m->second_nibbles);
    /* the tail being tried (armed: the memo is looked at once the search reaches s +
     * max_pivot), the next one to try (the latest occurrence found meanwhile), the tails of
     * the current line to record once the search is past its newline, and the start of the
     * last occurrence tried (each is tried once) */
    int armed = 0, waiting = 0, recs = 0;
    Py_ssize_t arm_s = 0, arm_nl = 0, next_s = 0, tried_s = -1, rec_nl = -1;
    int32_t arm_a = 0, next_a = 0;
    Py_ssize_t rec_s[MEMO_PENDING];
    int32_t rec_a[MEMO_PENDING];
    Py_ssize_t q = 0;
    while (q + 17 <= n) {
        if (recs && q > rec_nl) {
            for (int r = 0; r < recs; r++)
                if (memo_record(m, memo, d, rec_s[r], rec_a[r], rec_nl, starts, which) < 0)
                    return -1;
            recs = 0;
        }
        if (armed && q >= arm_s + m->max_pivot) {
            armed = 0;
            MemoEntry *e = &memo->entry[arm_a];
            if (q < arm_nl && e->len == arm_nl - arm_s + 1 &&
                memcmp(e->text, d + arm_s, e->len) == 0) {
                for (Py_ssize_t k = 0; k < e->nocc; k += 3)
                    if (e->occ[k + 2] >= q - arm_s &&
                        push_occurrence(starts, which, arm_s + e->occ[k], (int32_t)e->occ[k + 1]) < 0)
                        return -1;
                e->misses = 0;
                waiting = 0;
                tried_s = arm_nl;
                q = arm_nl + 1;
                continue;
            }
            e->misses++;
            if (recs < MEMO_PENDING && (recs == 0 || rec_nl == arm_nl)) {
                rec_s[recs] = arm_s;
                rec_a[recs++] = arm_a;
                rec_nl = arm_nl;
            }
        }
        Py_ssize_t found_before = starts->n;
        __m128i a = _mm_loadu_si128((const __m128i *)(d + q));
        __m128i b = _mm_loadu_si128((const __m128i *)(d + q + 1));
        uint32_t miss = (uint32_t)_mm_movemask_epi8(_mm_or_si128(in_set(a, first), in_set(b, second)));
        uint32_t mask = ~miss & 0xffffu;
        while (mask) {
            if (occurrences_at(m, d, n, q + __builtin_ctz(mask), starts, which) < 0) return -1;
            mask &= mask - 1;
        }
        q += 16;
        if (memo == NULL) continue;
        if (starts->n > found_before && starts->v[starts->n - 1] > tried_s) {
            waiting = 1;
            next_s = starts->v[starts->n - 1];
            next_a = (int32_t)which->v[starts->n - 1];
        }
        if (waiting && !armed) {
            waiting = 0;
            tried_s = next_s;
            MemoEntry *e = &memo->entry[next_a];
            if (e->misses >= MEMO_MISSES) continue;
            Py_ssize_t most = n - next_s < MEMO_MAX ? n - next_s : MEMO_MAX;
            const uint8_t *newline = memchr(d + next_s, '\n', most);
            if (newline == NULL || newline - (d + next_s) + 1 < MEMO_MIN) {
                e->misses++;
                continue;
            }
            armed = 1;
            arm_s = next_s;
            arm_a = next_a;
            arm_nl = newline - d;
        }
    }
    /* the end of the window: what is pending is not recorded (the next window's memo would
     * only be told tails already found) */
    for (; q + 1 < n; q++)
        if (occurrences_at(m, d, n, q, starts, which) < 0) return -1;
    return 0;
}

static int pivot_search_works(void) { return __builtin_cpu_supports("ssse3"); }
#else
#define HAVE_PIVOT_SEARCH 0
static int pivot_candidates(const Matcher *m, const uint8_t *d, Py_ssize_t n, Vec *starts,
                            Vec *which, Memo *memo) {
    return -1;
}
static int pivot_search_works(void) { return 0; }
#endif

/* The same matches as search_hashed, from every occurrence found by the pivots: in start
 * order (then the table's order), each one that starts at or after the end of the last one
 * taken. */
static int search_pivots(const Matcher *m, const uint8_t *d, Py_ssize_t n, Vec *offsets,
                         Vec *bits, Memo *memo) {
    Vec starts = {0}, which = {0};
    int failed = pivot_candidates(m, d, n, &starts, &which, memo) < 0;
    Py_ssize_t after = 0;
    for (Py_ssize_t k = 0; k < starts.n && !failed; k++) {
        if (starts.v[k] < after) continue;
        int32_t a = (int32_t)which.v[k];
        if (vec_push(offsets, starts.v[k]) < 0 || vec_push(bits, m->bits[a]) < 0) failed = 1;
        after = starts.v[k] + m->len[a];
    }
    free(starts.v);
    free(which.v);
    return failed ? -1 : 0;
}

#endif
