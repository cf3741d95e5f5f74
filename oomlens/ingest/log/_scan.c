/* The log reader's bulk scan in C: what oomlens/ingest/log/bulk.py's pure path computes with
 * Aho-Corasick, RE2 and numpy, in passes over a batch's bytes that visit each byte a few times
 * and each line once, with no object per line.
 *
 * Contract: scan(data, block_starts, prev_tail_len, matcher, tqdm_anchors) returns the arrays
 * of bulk.BatchScan (as bytearrays, read with numpy.frombuffer) that the pure path returns for
 * the same batch, label ids aside: for each memory line it returns where its label's text is
 * (or that it has none, or that the reader must look it up), and Python turns texts into ids
 * as the pure path does.  Every rule below mirrors a function of bulk.py, named at its place;
 * tests/ingest/log/test_native_scan.py checks the two against each other.
 *
 * The anchor search is in _scan_anchors.h, the line keys and shapes in _scan_shapes.h.
 *
 * Why C: issue 15 asks for a 1 GB dense 64-rank log within 3x `grep -c -E` on two cores; the
 * pure path's scan took 22 s of CPU per GB (RE2 extraction, Aho-Corasick's match tuples, numpy
 * passes over line heads), more than the whole budget.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* bulk.py's constants */
#define HEAD 32
#define NONE 0
#define MEMORY 1
#define CPU 2
#define FLUSH_LINE 3
#define STEP_GENERIC 4
#define STEP_DS 5
#define NO_KEY (-1)
#define UNSURE (-2)
#define DEFAULT_ROLE (1LL << 24)
#define LABEL_WINDOW 16384
#define LABEL_LINES 16
#define MAX_LINE_BYTES (64 * 1024)
#define NO_TS INT64_MIN
/* bits.py's kinds of line */
#define B_DS_MEMORY (1LL << 3)
#define B_DS_CPU (1LL << 4)
#define B_FLUSH (1LL << 5)
#define B_STEP (1LL << 15)
/* label statuses handed to Python */
#define L_NONE 0
#define L_DEFERRED 1
#define L_FAST 2
#define L_WALK 3

/* ---- growable int64 arrays */

typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} Vec;

static int vec_push(Vec *a, int64_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 1024;
        int64_t *v = realloc(a->v, cap * sizeof(int64_t));
        if (v == NULL) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

#include "_scan_anchors.h"
#include "_scan_shapes.h"

/* ---- the scan */

typedef struct {
    PyObject *obj;
    char *at;
} Out;

static int out_new(Out *o, Py_ssize_t bytes) {
    o->obj = PyByteArray_FromStringAndSize(NULL, bytes ? bytes : 1);
    if (o->obj == NULL) return -1;
    o->at = PyByteArray_AS_STRING(o->obj);
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view, blocks_view;
    Py_ssize_t prev_tail_len;
    PyObject *capsule, *tqdm;
    int pivots = 1;
    if (!PyArg_ParseTuple(args, "y*y*nOO!|p", &view, &blocks_view, &prev_tail_len, &capsule,
                          &PyTuple_Type, &tqdm, &pivots))
        return NULL;
    PyObject *result = NULL;
    Matcher *m = PyCapsule_GetPointer(capsule, "oomlens.matcher");
    const uint8_t *d = view.buf;
    Py_ssize_t n = view.len;
    const int64_t *bstart = blocks_view.buf;
    Py_ssize_t nblocks = blocks_view.len / (Py_ssize_t)sizeof(int64_t);
    Vec starts = {0}, hit_off = {0}, hit_bits = {0}, dirty_v = {0}, bar_at = {0};
    uint8_t *dirty = NULL;
    int64_t *walk_key = NULL; /* per line: its key for the walk, once read (UNSURE - 1: not yet) */
    int64_t *block_first = NULL;
    Out o[19] = {{0}};
    if (m == NULL) goto done;
    int use_pivots = pivots && HAVE_PIVOT_SEARCH && m->pivots_usable && pivot_search_works();

    /* 1. lines, and the lines cleaning would change or the per-line path re-reads (bulk._Lines:
     * CR, NUL, ESC, a byte past ASCII, a "[rank"/"[default" past a line's start), in one pass
     * that looks at 16 bytes at a time for the few that matter (a newline, a control byte, a
     * byte past ASCII, a bracket) */
    /* tqdm's anchors (steps.TQDM_ANCHORS): those with a slash are found in pass 1, from it */
    const char *bar_text[8];
    Py_ssize_t bar_len[8], bar_slash[8];
    int bar_count = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(tqdm); j++) {
        PyObject *a = PyTuple_GET_ITEM(tqdm, j);
        const char *slash = PyBytes_Check(a) ? memchr(PyBytes_AS_STRING(a), '/', PyBytes_GET_SIZE(a))
                                             : NULL;
        if (slash == NULL || bar_count == 8) continue;
        bar_text[bar_count] = PyBytes_AS_STRING(a);
        bar_len[bar_count] = PyBytes_GET_SIZE(a);
        bar_slash[bar_count++] = slash - PyBytes_AS_STRING(a);
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS;
    if (vec_push(&starts, 0) < 0) failed = 1; /* even empty data is one (empty) line, as in bulk */
    Py_END_ALLOW_THREADS;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    {
        Py_ssize_t line = 0;
        for (Py_ssize_t base = 0; base < n && !failed; base += 16) {
            uint32_t mask;
#ifdef __SSE2__
            if (base + 16 <= n) {
                __m128i v = _mm_loadu_si128((const __m128i *)(d + base));
                __m128i low = _mm_cmplt_epi8(v, _mm_set1_epi8(32)); /* < 32 or >= 128 */
                __m128i open = _mm_cmpeq_epi8(v, _mm_set1_epi8('['));
                __m128i slash = _mm_cmpeq_epi8(v, _mm_set1_epi8('/'));
                mask = (uint32_t)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(low, open), slash));
            } else
#endif
            {
                mask = 0;
                for (Py_ssize_t j = 0; j < 16 && base + j < n; j++) {
                    uint8_t b = d[base + j];
                    if (b < 32 || b >= 128 || b == '[' || b == '/') mask |= 1u << j;
                }
            }
            while (mask) {
                Py_ssize_t i = base + __builtin_ctz(mask);
                mask &= mask - 1;
                uint8_t b = d[i];
                if (b == '\n') {
                    if (i + 1 < n) {
                        if (vec_push(&starts, i + 1) < 0) {
                            failed = 1;
                            break;
                        }
                        line++;
                    }
                } else if (b == '\r' || b == 0 || b == 0x1b || b >= 128) {
                    if (vec_push(&dirty_v, line) < 0) {
                        failed = 1;
                        break;
                    }
                } else if (b == '/') {
                    /* a tqdm bar's anchor, found from its first slash */
                    for (int t = 0; t < bar_count; t++) {
                        Py_ssize_t at = i - bar_slash[t];
                        if (at >= 0 && bar_len[t] <= n - at &&
                            memcmp(d + at, bar_text[t], bar_len[t]) == 0 &&
                            (vec_push(&bar_at, at) < 0 || vec_push(&bar_at, bar_len[t]) < 0)) {
                            failed = 1;
                            break;
                        }
                    }
                } else if (b == '[' && i > 0 && d[i - 1] != '\n') {
                    if ((n - i >= 5 && memcmp(d + i, "[rank", 5) == 0) ||
                        (n - i >= 8 && memcmp(d + i, "[default", 8) == 0)) {
                        if (vec_push(&dirty_v, line) < 0) {
                            failed = 1;
                            break;
                        }
                    }
                }
            }
        }
    }
    Py_END_ALLOW_THREADS;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t lines = starts.n;
    dirty = calloc(lines ? lines : 1, 1);
    block_first = calloc(nblocks ? nblocks : 1, sizeof(int64_t));
    if (dirty == NULL || block_first == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < dirty_v.n; j++) dirty[dirty_v.v[j]] = 1;
    walk_key = malloc((lines ? lines : 1) * 2 * sizeof(int64_t));
    if (walk_key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < 2 * lines; j++) walk_key[j] = UNSURE - 1;
    Py_BEGIN_ALLOW_THREADS;
    {
        /* 2. anchors, leftmost-first (ahocorasick_rs's LeftmostFirst) */
        if ((use_pivots ? search_pivots : search_hashed)(m, d, n, &hit_off, &hit_bits) < 0)
            failed = 1;
        /* blocks' first lines */
        Py_ssize_t line_at = 0;
        for (Py_ssize_t b = 0; b < nblocks; b++) {
            while (line_at < lines && starts.v[line_at] < bstart[b]) line_at++;
            block_first[b] = line_at;
        }
    }
    Py_END_ALLOW_THREADS;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }

    /* hits to lines: a line's bits are those of its anchors */
    Py_ssize_t hits = 0;
    {
        Py_ssize_t line = 0;
        for (Py_ssize_t k = 0; k < hit_off.n; k++) {
            while (line + 1 < lines && starts.v[line + 1] <= hit_off.v[k]) line++;
            if (hits > 0 && hit_off.v[hits - 1] == line) {
                hit_bits.v[hits - 1] |= hit_bits.v[k];
            } else {
                hit_off.v[hits] = line; /* reused: the hit lines */
                hit_bits.v[hits] = hit_bits.v[k];
                hits++;
            }
        }
    }
    enum { O_COUNTS, O_LINE, O_BITS, O_START, O_KIND, O_KEY, O_PID, O_PLEN, O_TS, O_A, O_B, O_C,
           O_D, O_F, O_LSTATUS, O_LBEGIN, O_LEND, O_CONSUMED, O_BARS };
    Py_ssize_t sizes[19] = {nblocks * 8, hits * 8, hits * 8, hits * 8, hits, hits * 8, hits * 8,
                            hits * 8,    hits * 8, hits * 8, hits * 8, hits * 8, hits * 8,
                            hits * 8,    hits,     hits * 8, hits * 8, hits,     nblocks};
    for (int j = 0; j < 19; j++)
        if (out_new(&o[j], sizes[j]) < 0) goto done;
    int64_t *counts = (int64_t *)o[O_COUNTS].at, *hl = (int64_t *)o[O_LINE].at,
            *hb = (int64_t *)o[O_BITS].at, *hs = (int64_t *)o[O_START].at,
            *key = (int64_t *)o[O_KEY].at, *pid = (int64_t *)o[O_PID].at,
            *plen = (int64_t *)o[O_PLEN].at, *ts = (int64_t *)o[O_TS].at,
            *fa = (int64_t *)o[O_A].at, *fb = (int64_t *)o[O_B].at, *fc = (int64_t *)o[O_C].at,
            *fd = (int64_t *)o[O_D].at, *lbegin = (int64_t *)o[O_LBEGIN].at,
            *lend = (int64_t *)o[O_LEND].at;
    double *ff = (double *)o[O_F].at;
    int8_t *kind = (int8_t *)o[O_KIND].at, *lstatus = (int8_t *)o[O_LSTATUS].at;
    uint8_t *consumed = (uint8_t *)o[O_CONSUMED].at, *bars = (uint8_t *)o[O_BARS].at;

    for (Py_ssize_t b = 0; b < nblocks; b++)
        counts[b] = (b + 1 < nblocks ? block_first[b + 1] : lines) - block_first[b];
#define LINE_END(l) ((l) + 1 < lines ? starts.v[(l) + 1] - 1 : (n > 0 && d[n - 1] == '\n' ? n - 1 : n))
#define ENTRY_END(l) ((l) + 1 < lines ? starts.v[(l) + 1] : n)

    Py_BEGIN_ALLOW_THREADS;
    /* 3. per hit line: its key and prefix, and the bulk shape it is in (bulk._shapes) */
    for (Py_ssize_t k = 0; k < hits; k++) {
        Py_ssize_t line = hit_off.v[k];
        Py_ssize_t s = starts.v[line];
        uint8_t h[HEAD];
        head_of(d, n, s, h);
        int64_t kk, pl;
        line_key(h, &kk, &pl);
        hl[k] = line;
        hb[k] = hit_bits.v[k];
        hs[k] = s;
        key[k] = kk;
        plen[k] = pl;
        int logger = at(h, pl) == '[';
        int space = at(h, pl > 0 ? pl - 1 : 0) == ' ';
        pid[k] = (kk + 2) * 64 + pl * 2 + (space && pl > 0);
        kind[k] = NONE;
        ts[k] = NO_TS;
        fa[k] = 0;
        fb[k] = -1;
        fc[k] = -1;
        fd[k] = 0;
        ff[k] = NAN;
        lstatus[k] = L_NONE;
        lbegin[k] = lend[k] = 0;
        consumed[k] = 0;
        if (dirty[line] || kk == UNSURE) continue;
        int64_t bits = hb[k];
        int shape = bits == B_DS_MEMORY ? MEMORY
                    : bits == B_DS_CPU  ? CPU
                    : bits == B_FLUSH   ? FLUSH_LINE
                    : bits == B_STEP    ? (logger ? STEP_DS : STEP_GENERIC)
                                        : NONE;
        if (shape == NONE) continue;
        Fields f = {NO_TS, 0, -1, -1, 0, NAN, 1};
        Cur c = {d + s + pl, d + ENTRY_END(line)};
        if (!match_shape(shape, logger, &c, &f)) continue;
        ts[k] = f.ts;
        fa[k] = f.a;
        fb[k] = f.b;
        fc[k] = f.c;
        fd[k] = f.d;
        ff[k] = f.f;
        if (f.valid) kind[k] = (int8_t)shape;
    }
    /* 4. a CPU line read with the memory line before it (bulk._consumed_cpu) */
    for (Py_ssize_t k = 0; k + 1 < hits; k++) {
        if (kind[k] != MEMORY) continue;
        Py_ssize_t line = hl[k], nxt = k + 1;
        if (hl[nxt] != line + 1 || !(hb[nxt] & B_DS_CPU)) continue;
        Py_ssize_t b = 0, lo = 0, hi = nblocks; /* block_of(line) == block_of(line + 1) */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (block_first[mid] <= line + 1) lo = mid + 1;
            else hi = mid;
        }
        b = lo - 1;
        if (b >= 0 && block_first[b] == line + 1) continue;
        if (kind[nxt] == CPU) {
            if (ts[nxt] == NO_TS && pid[nxt] == pid[k]) consumed[nxt] = 1;
        } else {
            Py_ssize_t s = hs[k], t = starts.v[line + 1], pl = plen[k];
            static const char CPU_ANCHOR[] = "CPU Virtual Memory";
            Py_ssize_t want = pl + (Py_ssize_t)sizeof CPU_ANCHOR - 1;
            if (n - t >= want && memcmp(d + t, d + s, pl) == 0 &&
                memcmp(d + t + pl, CPU_ANCHOR, sizeof CPU_ANCHOR - 1) == 0)
                kind[k] = NONE;
        }
    }
    /* 5. labels (bulk._labels, bulk._walk): the line before with the same raw prefix, else the
     * nearest of the 16 lines before, within 16 KiB, of the same stream */
    for (Py_ssize_t k = 0; k < hits; k++) {
        if (kind[k] != MEMORY) continue;
        Py_ssize_t line = hl[k], begin = hs[k], pl = plen[k];
        Py_ssize_t lo = 0, hi = nblocks;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (block_first[mid] <= line) lo = mid + 1;
            else hi = mid;
        }
        Py_ssize_t block = lo - 1;
        Py_ssize_t block_start = bstart[block];
        Py_ssize_t relative = begin - block_start;
        Py_ssize_t prev_start = starts.v[line > 0 ? line - 1 : 0];
        int same = relative > 0;
        for (Py_ssize_t j = 0; j < pl && same; j++) {
            Py_ssize_t here = begin + j < n ? begin + j : n - 1;
            Py_ssize_t there = prev_start + j < n ? prev_start + j : n - 1;
            same = prev_start + j < begin && d[here] == d[there];
        }
        if (same) {
            Py_ssize_t after = prev_start + pl < n ? prev_start + pl : n - 1;
            if (d[after] != '[' && d[after] != '(') {
                lstatus[k] = L_FAST;
                lbegin[k] = prev_start + pl;
                lend[k] = begin - 1;
                continue;
            }
        }
        Py_ssize_t before = block > 0 ? bstart[block - 1] : -prev_tail_len;
        Py_ssize_t window = relative >= LABEL_WINDOW ? begin - LABEL_WINDOW
                            : (before > block_start - LABEL_WINDOW ? before
                                                                   : block_start - LABEL_WINDOW);
        int status = L_NONE; /* 16 lines and no stop */
        Py_ssize_t after_edge = begin;
        for (int step = 1; step <= LABEL_LINES; step++) {
            Py_ssize_t target = line - step;
            int complete = target >= 0 && starts.v[target] >= window;
            if (!complete) {
                status = window >= 0 && after_edge == window ? L_NONE : L_DEFERRED;
                break;
            }
            int64_t tk = walk_key[2 * target], tp = walk_key[2 * target + 1];
            if (tk == UNSURE - 1) { /* consecutive memory lines walk over the same lines */
                uint8_t h[HEAD];
                head_of(d, n, starts.v[target], h);
                line_key(h, &tk, &tp);
                if (dirty[target] || LINE_END(target) - starts.v[target] > MAX_LINE_BYTES)
                    tk = UNSURE;
                walk_key[2 * target] = tk;
                walk_key[2 * target + 1] = tp;
            }
            if (tk == key[k]) {
                status = L_WALK;
                lbegin[k] = starts.v[target] + tp;
                lend[k] = LINE_END(target);
                break;
            }
            if (tk == UNSURE) {
                status = L_DEFERRED;
                break;
            }
            after_edge = starts.v[target];
        }
        lstatus[k] = (int8_t)status;
    }
    Py_END_ALLOW_THREADS;
    /* 6. per block, whether a tqdm bar's anchor lies wholly in it (bulk._progress_bars) */
    for (Py_ssize_t b = 0; b < nblocks; b++) bars[b] = 0;
    for (Py_ssize_t j = 0; j + 1 < bar_at.n; j += 2) {
        Py_ssize_t at = bar_at.v[j], lo = 0, hi = nblocks;
        while (lo < hi) { /* the block the anchor starts in */
            Py_ssize_t mid = (lo + hi) / 2;
            if (bstart[mid] <= at) lo = mid + 1;
            else hi = mid;
        }
        Py_ssize_t b = lo - 1;
        if (b >= 0 && at + bar_at.v[j + 1] <= (b + 1 < nblocks ? bstart[b + 1] : n)) bars[b] = 1;
    }
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        Py_ssize_t from = bstart[b], to = b + 1 < nblocks ? bstart[b + 1] : n;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(tqdm) && !bars[b]; j++) {
            PyObject *a = PyTuple_GET_ITEM(tqdm, j);
            if (!PyBytes_Check(a) || memchr(PyBytes_AS_STRING(a), '/', PyBytes_GET_SIZE(a)))
                continue;
            if (from < to && memmem(d + from, to - from, PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a)))
                bars[b] = 1;
        }
    }
    result = PyTuple_New(19);
    if (result == NULL) goto done;
    for (int j = 0; j < 19; j++) {
        if (PyByteArray_Resize(o[j].obj, sizes[j]) < 0) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, j, o[j].obj);
        o[j].obj = NULL;
    }
done:
    for (int j = 0; j < 19; j++) Py_XDECREF(o[j].obj);
    free(starts.v);
    free(dirty_v.v);
    free(bar_at.v);
    free(walk_key);
    free(hit_off.v);
    free(hit_bits.v);
    free(dirty);
    free(block_first);
    PyBuffer_Release(&view);
    PyBuffer_Release(&blocks_view);
    return result;
}

static PyMethodDef METHODS[] = {
    {"make_matcher", make_matcher, METH_VARARGS,
     "make_matcher(anchors, bits, pivots): the anchor table, for scan"},
    {"scan", scan, METH_VARARGS,
     "scan(data, block_starts, prev_tail_len, matcher, tqdm_anchors, pivots=True): the batch's "
     "arrays (pivots=False: the anchors by the hash filter alone, the same hits)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_scan",
                                    "The log reader's bulk scan in C (see _scan.c).", -1, METHODS};

PyMODINIT_FUNC PyInit__scan(void) {
    init_tables();
    C_LOCALE = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (C_LOCALE == (locale_t)0) return PyErr_NoMemory();
    PyObject *module = PyModule_Create(&MODULE);
    if (module == NULL) return NULL;
    /* the constants this file shares with bulk.py and bits.py, for the tests to compare */
    const struct {
        const char *name;
        long long value;
    } shared[] = {
        {"MEMORY", MEMORY},         {"CPU", CPU},
        {"FLUSH_LINE", FLUSH_LINE}, {"STEP_GENERIC", STEP_GENERIC},
        {"STEP_DS", STEP_DS},       {"NO_KEY", NO_KEY},
        {"UNSURE", UNSURE},         {"DEFAULT_ROLE", DEFAULT_ROLE},
        {"LABEL_WINDOW", LABEL_WINDOW}, {"LABEL_LINES", LABEL_LINES},
        {"MAX_LINE_BYTES", MAX_LINE_BYTES}, {"DS_MEMORY", B_DS_MEMORY},
        {"DS_CPU", B_DS_CPU},       {"FLUSH", B_FLUSH},
        {"STEP", B_STEP},           {"HEAD", HEAD},
    };
    for (size_t j = 0; j < sizeof shared / sizeof shared[0]; j++) {
        if (PyModule_AddObject(module, shared[j].name, PyLong_FromLongLong(shared[j].value)) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
