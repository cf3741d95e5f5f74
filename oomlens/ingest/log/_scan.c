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
 * Two helpers of the reader's apply live here too: label_keys (bulk_labels.Labels.ids_of's grouping
 * of label texts, by a hash table) and grouped_sums (series.grouped_sums's exact sums, in
 * 128-bit integers); tests/ingest/log/test_bulk.py checks the sums against fractions.  And
 * one of the apply's (_scan_apply.h): the order in which a run's memory samples close.
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
#define PROGRESS 4
#define NO_KEY (-1)
#define UNSURE (-2)
#define DEFAULT_ROLE (1LL << 24)
#define TASK_ROLE (2LL << 24)
#define LABEL_WINDOW 16384
#define LABEL_LINES 16
#define MAX_LINE_BYTES (64 * 1024)
#define NO_TS INT64_MIN
/* bits.py's kinds of line */
#define B_DS_MEMORY (1LL << 3)
#define B_DS_CPU (1LL << 4)
#define B_FLUSH (1LL << 5)
#define B_STEP (1LL << 15)
/* what cleaning changes in a line: which CR segment is read; bytes (NUL, ESC, past ASCII);
 * nothing, but the line holds symbols past ASCII (plain_symbol) */
#define DIRTY_CR 1
#define DIRTY_OTHER 2
#define DIRTY_SYMBOL 4
/* label statuses handed to Python */
#define L_NONE 0
#define L_DEFERRED 1
#define L_FAST 2
#define L_WALK 3
#define L_TEXT 4 /* lbegin..lend: the label's text itself, as bulk_labels.Labels.id_of reads it */

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
#include "_scan_progress.h"

/* ---- the passes over a window's hits */

#define WINDOW_BYTES (256 * 1024)

enum { O_COUNTS, O_LINE, O_BITS, O_START, O_KIND, O_KEY, O_PID, O_PLEN, O_TS, O_A, O_B, O_C,
       O_D, O_F, O_LSTATUS, O_LBEGIN, O_LEND, O_CONSUMED, O_BARS, O_E, O_G, O_H, OUTPUTS };
/* bytes per hit of each output (0: the per-block ones) */
static const Py_ssize_t HIT_WIDTH[OUTPUTS] = {0, 8, 8, 8, 1, 8, 8, 8, 8, 8, 8, 8,
                                              8, 8, 1, 8, 8, 1, 0, 8, 8, 8};

/* What the passes read (the batch, its lines) and write (the hits' arrays). */
typedef struct {
    const uint8_t *d;
    Py_ssize_t n;
    const int64_t *starts;
    Py_ssize_t lines;
    const uint8_t *dirty; /* per line: DIRTY_CR, DIRTY_OTHER: what cleaning changes */
    const int64_t *glued; /* per line: where its last `[rank`/`[default` past its start is (0: none) */
    Hosts *hosts;
    int64_t *walk_key; /* per line: walk_line's key, label begin and end (UNSURE - 1: not yet) */
    const int64_t *block_first, *bstart;
    Py_ssize_t nblocks, prev_tail_len;
    int64_t *hl, *hb, *hs, *key, *pid, *plen, *ts, *fa, *fb, *fc, *fd, *lbegin, *lend, *fe, *fh;
    double *ff, *fg;
    int8_t *kind, *lstatus;
    uint8_t *consumed;
} Ctx;

static inline Py_ssize_t line_end(const Ctx *x, Py_ssize_t l) {
    if (l + 1 < x->lines) return x->starts[l + 1] - 1;
    return x->n > 0 && x->d[x->n - 1] == '\n' ? x->n - 1 : x->n;
}

static inline Py_ssize_t entry_end(const Ctx *x, Py_ssize_t l) {
    return l + 1 < x->lines ? x->starts[l + 1] : x->n;
}

/* The block a line is in (the last block whose first line is at or before it). */
static inline Py_ssize_t block_of(const Ctx *x, Py_ssize_t line) {
    Py_ssize_t lo = 0, hi = x->nblocks;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x->block_first[mid] <= line) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

/* 3. hits from..to: each line's key and prefix, and the bulk shape it is in (bulk._shapes) */
static void shape_hits(Ctx *x, Py_ssize_t from, Py_ssize_t to) {
    const uint8_t *d = x->d;
    for (Py_ssize_t k = from; k < to; k++) {
        Py_ssize_t line = x->hl[k];
        Py_ssize_t s = x->starts[line];
        uint8_t h[HEAD];
        head_of(d, x->n, s, h);
        int64_t kk, pl;
        int followed;
        line_key(d, x->n, s, h, &kk, &pl, x->hosts, &followed);
        if (kk >= HOST_ROLE && followed) x->hosts->followed[kk / HOST_ROLE - 1] = 1;
        x->hs[k] = s;
        x->key[k] = kk;
        x->plen[k] = pl;
        int space = pl > 0 && s + pl - 1 < x->n && d[s + pl - 1] == ' ';
        /* equal ids, equal prefix texts: the key, the length, a space at its end, the form */
        x->pid[k] = (((kk + 2) * 512 + pl * 2 + space) << 1) + (lightning_digits(h) > 0);
        x->kind[k] = NONE;
        x->ts[k] = NO_TS;
        x->fa[k] = 0;
        x->fb[k] = -1;
        x->fc[k] = -1;
        x->fd[k] = 0;
        x->ff[k] = NAN;
        x->fe[k] = x->fh[k] = -1;
        x->fg[k] = NAN;
        x->lstatus[k] = L_NONE;
        x->lbegin[k] = x->lend[k] = 0;
        x->consumed[k] = 0;
        /* a line whose rest holds another rank's prefix (reader._GLUED) is read line by line */
        if (x->dirty[line] || kk == UNSURE || x->glued[line] > s + pl) continue;
        int64_t bits = x->hb[k];
        int shape = bits == B_DS_MEMORY ? MEMORY
                    : bits == B_DS_CPU  ? CPU
                    : bits == B_FLUSH   ? FLUSH_LINE
                    : bits == B_STEP    ? PROGRESS
                                        : NONE;
        if (shape == NONE) continue;
        Fields f = {NO_TS, 0, -1, -1, 0, NAN, 1, -1, -1, NAN};
        Cur c = {d + s + pl, d + entry_end(x, line)};
        if (shape == PROGRESS ? !progress_line(&c, &f) : !match_shape(shape, &c, &f))
            continue;
        x->fe[k] = f.e;
        x->fh[k] = f.h;
        x->fg[k] = f.g;
        x->ts[k] = f.ts;
        x->fa[k] = f.a;
        x->fb[k] = f.b;
        x->fc[k] = f.c;
        x->fd[k] = f.d;
        x->ff[k] = f.f;
        if (f.valid) x->kind[k] = (int8_t)shape;
    }
}

/* 4. hits from..to (each with a next hit, below hits): a CPU line read with the memory line
 * before it (bulk._consumed_cpu) */
static void read_cpu_ahead(Ctx *x, Py_ssize_t from, Py_ssize_t to, Py_ssize_t hits) {
    const uint8_t *d = x->d;
    for (Py_ssize_t k = from; k < to && k + 1 < hits; k++) {
        if (x->kind[k] != MEMORY) continue;
        Py_ssize_t line = x->hl[k], nxt = k + 1;
        if (x->hl[nxt] != line + 1 || !(x->hb[nxt] & B_DS_CPU)) continue;
        Py_ssize_t b = block_of(x, line + 1); /* block_of(line) == block_of(line + 1) */
        if (b >= 0 && x->block_first[b] == line + 1) continue;
        if (x->kind[nxt] == CPU) {
            if (x->ts[nxt] == NO_TS && x->pid[nxt] == x->pid[k]) x->consumed[nxt] = 1;
        } else {
            Py_ssize_t s = x->hs[k], t = x->starts[line + 1], pl = x->plen[k];
            static const char CPU_ANCHOR[] = "CPU Virtual Memory";
            Py_ssize_t want = pl + (Py_ssize_t)sizeof CPU_ANCHOR - 1;
            if (x->n - t >= want && memcmp(d + t, d + s, pl) == 0 &&
                memcmp(d + t + pl, CPU_ANCHOR, sizeof CPU_ANCHOR - 1) == 0)
                x->kind[k] = NONE;
        }
    }
}

/* Whether the bytes at t open a character of U+2010..U+2BFF other than U+202F, encoded as UTF-8
 * (punctuation, arrows, box drawing, tqdm's block elements, geometric shapes, symbols):
 * LineCleaner.clean leaves it as it is (not in textstream._NARROW, valid UTF-8), and the
 * prefix parser takes it for no part of a prefix (no decimal digit, `\d`, among them; the
 * letters and other digits there fail its ASCII classes, as they fail the scan's). */
static int plain_symbol(const uint8_t *t, Py_ssize_t left) {
    if (left < 3 || t[0] != 0xE2 || t[1] < 0x80 || t[1] > 0xAF || (t[2] & 0xC0) != 0x80) return 0;
    int code = 0x2000 + ((t[1] - 0x80) << 6) + (t[2] - 0x80);
    return code >= 0x2010 && code != 0x202F;
}

/* The last non-blank segment of a line a progress bar rewrote with CRs (what
 * textstream.last_carriage_segment keeps of it, and LineCleaner.clean reads), from..to; 0 when
 * every segment is blank. */
static int carriage_segment(const uint8_t *d, Py_ssize_t *from, Py_ssize_t *to) {
    Py_ssize_t s = *from, e = *to;
    while (e > s && d[e - 1] == '\r') e--;
    const uint8_t *cr = memchr(d + s, '\r', e - s);
    if (cr == NULL) {
        *to = e;
        return 1;
    }
    while (e > s) {
        Py_ssize_t b = e;
        while (b > s && d[b - 1] != '\r') b--;
        for (Py_ssize_t j = b; j < e; j++) {
            uint8_t c = d[j];
            if (!(c == ' ' || c == '\t' || c == 0x0b || c == 0x0c)) {
                *from = b;
                *to = e;
                return 1;
            }
        }
        e = b > s ? b - 1 : s;
    }
    return 0;
}

/* A line the label walk passes (reader_context.label_before's strip_prefixes of its cleaned
 * text): its stream key (UNSURE where cleaning changes more than which CR segment is read,
 * or cuts it), and where its text after the prefix begins and ends. */
static void walk_line(Ctx *x, Py_ssize_t line, int64_t *walked) {
    Py_ssize_t from = x->starts[line], to = line_end(x, line);
    int64_t key = UNSURE, prefix = 0;
    int dirty = x->dirty[line];
    if (!(dirty & DIRTY_OTHER) && to - from <= MAX_LINE_BYTES &&
        (!(dirty & DIRTY_CR) || carriage_segment(x->d, &from, &to))) {
        uint8_t h[HEAD];
        head_of(x->d, to, from, h); /* the segment alone: what lies past it is no part of it */
        /* symbols past ASCII (plain_symbol) end a prefix for both parsers, as DEL does: the
         * head's test for bytes cleaning may turn into ASCII need not see them */
        if (dirty & DIRTY_SYMBOL)
            for (int j = 0; j < HEAD; j++) h[j] = h[j] >= 0x80 ? 0x7F : h[j];
        line_key(x->d, to, from, h, &key, &prefix, x->hosts, NULL);
    }
    walked[0] = key;
    walked[1] = from + prefix;
    walked[2] = to;
}

/* How long the head deepspeed._LOGGER matches at t is (a logger record's `[date time,ms]
 * [LEVEL] [file:line:func] `), 0 when it does not. */
static Py_ssize_t logger_head(const uint8_t *t, Py_ssize_t len) {
    static const char stamp[] = "[0000-00-00 00:00:00,000] [";
    Py_ssize_t i = (Py_ssize_t)sizeof stamp - 1;
    if (len < i) return 0;
    for (Py_ssize_t j = 0; j < i; j++)
        if (stamp[j] == '0' ? !DIGIT[t[j]] : t[j] != (uint8_t)stamp[j]) return 0;
    Py_ssize_t level = 0;
    while (i + level < len && t[i + level] >= 'A' && t[i + level] <= 'Z' && level < 11) level++;
    i += level;
    if (level < 1 || level > 10 || i + 3 > len || memcmp(t + i, "] [", 3) != 0) return 0;
    i += 3;
    Py_ssize_t file = 0;
    while (i + file < len && t[i + file] != ']' && t[i + file] != ':' && t[i + file] != '\n') file++;
    i += file;
    if (file < 1 || file > 120 || i >= len || t[i] != ':') return 0;
    i++;
    Py_ssize_t digits = 0;
    while (i + digits < len && DIGIT[t[i + digits]]) digits++;
    i += digits;
    if (digits < 1 || digits > 7 || i >= len || t[i] != ':') return 0;
    i++;
    Py_ssize_t func = 0;
    while (i + func < len && t[i + func] != ']' && t[i + func] != '\n') func++;
    i += func;
    if (func < 1 || func > 120 || i >= len || t[i] != ']') return 0;
    i++;
    return i < len && t[i] == ' ' ? i + 1 : i;
}

/* A label whose bytes cleaning leaves as they are (plain ASCII, no CR): its text as
 * bulk_labels.Labels.id_of makes it (strip_logger, strip, none when empty or itself a memory
 * line, cut to 200), so that Python makes one string per distinct text, nothing per line. */
static void label_text(Ctx *x, Py_ssize_t k, Py_ssize_t source) {
    Py_ssize_t b = x->lbegin[k], e = x->lend[k];
    if (x->dirty[source] || e < b || e - b > MAX_LINE_BYTES) return;
    const uint8_t *d = x->d;
    b += logger_head(d + b, e - b);
    while (b < e && is_space(d[b])) b++;
    while (e > b && is_space(d[e - 1])) e--;
    if (b == e || memmem(d + b, e - b, "Max_MA", 6) || memmem(d + b, e - b, "CPU Virtual Memory", 18)) {
        x->lstatus[k] = L_NONE;
        return;
    }
    x->lbegin[k] = b;
    x->lend[k] = e - b > 200 ? b + 200 : e;
    x->lstatus[k] = L_TEXT;
}

/* 5. hits from..to: labels (bulk._labels, bulk._walk): the line before with the same raw
 * prefix, else the nearest of the 16 lines before, within 16 KiB, of the same stream */
static void label_hits(Ctx *x, Py_ssize_t from, Py_ssize_t to) {
    const uint8_t *d = x->d;
    const int64_t *starts = x->starts;
    Py_ssize_t n = x->n;
    for (Py_ssize_t k = from; k < to; k++) {
        if (x->kind[k] != MEMORY) continue;
        Py_ssize_t line = x->hl[k], begin = x->hs[k], pl = x->plen[k];
        Py_ssize_t block = block_of(x, line);
        Py_ssize_t block_start = x->bstart[block];
        Py_ssize_t relative = begin - block_start;
        Py_ssize_t prev_start = starts[line > 0 ? line - 1 : 0];
        int same = relative > 0;
        for (Py_ssize_t j = 0; j < pl && same; j++) {
            Py_ssize_t here = begin + j < n ? begin + j : n - 1;
            Py_ssize_t there = prev_start + j < n ? prev_start + j : n - 1;
            same = prev_start + j < begin && d[here] == d[there];
        }
        if (same) {
            Py_ssize_t after = prev_start + pl < n ? prev_start + pl : n - 1;
            if (d[after] != '[' && d[after] != '(') {
                x->lstatus[k] = L_FAST;
                x->lbegin[k] = prev_start + pl;
                x->lend[k] = begin - 1;
                label_text(x, k, line - 1);
                continue;
            }
        }
        Py_ssize_t before = block > 0 ? x->bstart[block - 1] : -x->prev_tail_len;
        Py_ssize_t window = relative >= LABEL_WINDOW ? begin - LABEL_WINDOW
                            : (before > block_start - LABEL_WINDOW ? before
                                                                   : block_start - LABEL_WINDOW);
        int status = L_NONE; /* 16 lines and no stop */
        Py_ssize_t source = -1;
        Py_ssize_t after_edge = begin;
        for (int step = 1; step <= LABEL_LINES; step++) {
            Py_ssize_t target = line - step;
            int complete = target >= 0 && starts[target] >= window;
            if (!complete) {
                status = window >= 0 && after_edge == window ? L_NONE : L_DEFERRED;
                break;
            }
            int64_t *walked = x->walk_key + 3 * target;
            if (walked[0] == UNSURE - 1) { /* consecutive memory lines walk over the same lines */
                walk_line(x, target, walked);
            }
            int64_t tk = walked[0];
            if (tk == x->key[k]) {
                status = L_WALK;
                x->lbegin[k] = walked[1];
                x->lend[k] = walked[2];
                source = target;
                break;
            }
            if (tk == UNSURE) {
                status = L_DEFERRED;
                break;
            }
            after_edge = starts[target];
        }
        x->lstatus[k] = (int8_t)status;
        if (status == L_WALK) label_text(x, k, source);
    }
}

/* ---- the scan */

typedef struct {
    PyObject *obj;
    char *at;
} Out;

/* The hits' arrays of x at the outputs o (again after they grow). */
static void point_at(Ctx *x, const Out *o) {
    x->hl = (int64_t *)o[O_LINE].at;
    x->hb = (int64_t *)o[O_BITS].at;
    x->hs = (int64_t *)o[O_START].at;
    x->key = (int64_t *)o[O_KEY].at;
    x->pid = (int64_t *)o[O_PID].at;
    x->plen = (int64_t *)o[O_PLEN].at;
    x->ts = (int64_t *)o[O_TS].at;
    x->fa = (int64_t *)o[O_A].at;
    x->fb = (int64_t *)o[O_B].at;
    x->fc = (int64_t *)o[O_C].at;
    x->fd = (int64_t *)o[O_D].at;
    x->lbegin = (int64_t *)o[O_LBEGIN].at;
    x->lend = (int64_t *)o[O_LEND].at;
    x->ff = (double *)o[O_F].at;
    x->kind = (int8_t *)o[O_KIND].at;
    x->lstatus = (int8_t *)o[O_LSTATUS].at;
    x->consumed = (uint8_t *)o[O_CONSUMED].at;
    x->fe = (int64_t *)o[O_E].at;
    x->fh = (int64_t *)o[O_H].at;
    x->fg = (double *)o[O_G].at;
}

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
    Py_ssize_t expected = -1, window_bytes = WINDOW_BYTES;
    if (!PyArg_ParseTuple(args, "y*y*nOO!|pnn", &view, &blocks_view, &prev_tail_len, &capsule,
                          &PyTuple_Type, &tqdm, &pivots, &expected, &window_bytes))
        return NULL;
    PyObject *result = NULL;
    Matcher *m = PyCapsule_GetPointer(capsule, "oomlens.matcher");
    const uint8_t *d = view.buf;
    Py_ssize_t n = view.len;
    const int64_t *bstart = blocks_view.buf;
    Py_ssize_t nblocks = blocks_view.len / (Py_ssize_t)sizeof(int64_t);
    Vec starts = {0}, hit_off = {0}, hit_bits = {0}, dirty_v = {0}, bar_at = {0}, glued_v = {0};
    uint8_t *dirty = NULL;
    int64_t *glued = NULL;
    Hosts *hosts = NULL;
    int64_t *walk_key = NULL;
    int64_t *block_first = NULL;
    Out o[OUTPUTS] = {{0}};
    Memo memo = {0}; /* the tails seen before, over all windows (_scan_anchors.h) */
    if (m == NULL) goto done;
    int use_pivots = pivots && HAVE_PIVOT_SEARCH && m->pivots_usable && pivot_search_works();

    /* 1. lines, the lines cleaning would change (bulk._Lines: CR, NUL, ESC, a byte past
     * ASCII) and where a "[rank"/"[default" past a line's start is (the per-line path re-reads
     * the line from there when it lies past the line's prefixes: reader._GLUED), in one pass
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
        Py_ssize_t line = 0, symbol_until = 0;
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
                } else if (b >= 0x80 && i < symbol_until) {
                    /* the rest of a symbol's bytes */
                } else if (b == '\r' || b == 0 || b == 0x1b || b >= 0x80) {
                    int what = b == '\r' ? DIRTY_CR : DIRTY_OTHER;
                    if (b >= 0x80 && plain_symbol(d + i, n - i)) {
                        what = DIRTY_SYMBOL;
                        symbol_until = i + 3;
                    }
                    if (vec_push(&dirty_v, 8 * line + what) < 0) {
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
                        if (vec_push(&glued_v, line) < 0 || vec_push(&glued_v, i) < 0) {
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
    glued = calloc(lines ? lines : 1, sizeof(int64_t));
    hosts = calloc(1, sizeof(Hosts));
    block_first = calloc(nblocks ? nblocks : 1, sizeof(int64_t));
    if (dirty == NULL || glued == NULL || hosts == NULL || block_first == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < dirty_v.n; j++) dirty[dirty_v.v[j] / 8] |= dirty_v.v[j] % 8;
    for (Py_ssize_t j = 0; j + 1 < glued_v.n; j += 2) glued[glued_v.v[j]] = glued_v.v[j + 1];
    walk_key = malloc((lines ? lines : 1) * 3 * sizeof(int64_t));
    if (walk_key == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < 3 * lines; j++) walk_key[j] = UNSURE - 1;
    /* blocks' first lines */
    {
        Py_ssize_t line_at = 0;
        for (Py_ssize_t b = 0; b < nblocks; b++) {
            while (line_at < lines && starts.v[line_at] < bstart[b]) line_at++;
            block_first[b] = line_at;
        }
    }
    /* the outputs: room for the hits expected (by default one line in two), grown as more
     * come, cut to the hits found at the end (room for a hit on every line cost a sparse
     * log's batches in flight 27 MiB of peak RSS; growing from little, copies) */
    Py_ssize_t room = expected >= 0 ? expected + 1024 : 1024 + lines / 2, sizes[OUTPUTS];
    if (room > lines) room = lines;
    for (int j = 0; j < OUTPUTS; j++) sizes[j] = j == O_COUNTS ? nblocks * 8 : j == O_BARS ? nblocks
                                                                         : room * HIT_WIDTH[j];
    for (int j = 0; j < OUTPUTS; j++)
        if (out_new(&o[j], sizes[j]) < 0) goto done;
    Ctx x = {.d = d,
             .n = n,
             .starts = starts.v,
             .lines = lines,
             .dirty = dirty,
             .glued = glued,
             .hosts = hosts,
             .walk_key = walk_key,
             .block_first = block_first,
             .bstart = bstart,
             .nblocks = nblocks,
             .prev_tail_len = prev_tail_len};
    point_at(&x, o);
    int64_t *counts = (int64_t *)o[O_COUNTS].at;
    uint8_t *bars = (uint8_t *)o[O_BARS].at;
    for (Py_ssize_t b = 0; b < nblocks; b++)
        counts[b] = (b + 1 < nblocks ? block_first[b + 1] : lines) - block_first[b];

    /* 2-5, a window of lines at a time: the passes over a window's bytes find them in the
     * cache (8 MiB batches scanned whole, pass after pass, ran a third slower: the line heads
     * and label walks missed the cache).  Anchors hold no newline, so each window's search
     * finds what a search of the whole batch would.  A hit's CPU line (pass 4) may be the next
     * window's first hit: the last hit of a window waits for it. */
    Py_ssize_t hits = 0, settled = 0;
    if (use_pivots && memo_init(&memo, m) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t first = 0; first < lines && !failed;) {
        Py_ssize_t last = first + 1;
        while (last < lines && starts.v[last] - starts.v[first] < window_bytes) last++;
        Py_ssize_t from = starts.v[first], to = last < lines ? starts.v[last] : n;
        /* 2. anchors, leftmost-first (ahocorasick_rs's LeftmostFirst) */
        hit_off.n = hit_bits.n = 0;
        if ((use_pivots ? search_pivots(m, d + from, to - from, &hit_off, &hit_bits, &memo)
                        : search_hashed(m, d + from, to - from, &hit_off, &hit_bits)) < 0) {
            failed = 1;
            break;
        }
        if (hits + hit_off.n > room) {
            Py_ssize_t more = 2 * room > hits + hit_off.n ? 2 * room : hits + hit_off.n;
            room = more < lines ? more : lines;
            Py_BLOCK_THREADS;
            for (int j = 0; j < OUTPUTS && !failed; j++)
                if (HIT_WIDTH[j] && PyByteArray_Resize(o[j].obj, room * HIT_WIDTH[j]) < 0) failed = 1;
            for (int j = 0; j < OUTPUTS && !failed; j++) o[j].at = PyByteArray_AS_STRING(o[j].obj);
            Py_UNBLOCK_THREADS;
            if (failed) break;
            point_at(&x, o);
        }
        /* hits to lines: a line's bits are those of its anchors */
        Py_ssize_t line = first, window_hits = hits;
        for (Py_ssize_t k = 0; k < hit_off.n; k++) {
            Py_ssize_t at = from + hit_off.v[k];
            while (line + 1 < lines && starts.v[line + 1] <= at) line++;
            if (hits > window_hits && x.hl[hits - 1] == line) {
                x.hb[hits - 1] |= hit_bits.v[k];
            } else {
                x.hl[hits] = line;
                x.hb[hits] = hit_bits.v[k];
                hits++;
            }
        }
        shape_hits(&x, window_hits, hits);
        Py_ssize_t ready = hits > 0 ? hits - 1 : 0;
        read_cpu_ahead(&x, settled, ready, hits);
        label_hits(&x, settled, ready);
        settled = ready;
        first = last;
    }
    if (!failed) label_hits(&x, settled, hits);
    Py_END_ALLOW_THREADS;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    for (int j = 0; j < OUTPUTS; j++) /* the hits' arrays: they had room for a hit on every line */
        if (HIT_WIDTH[j]) sizes[j] = hits * HIT_WIDTH[j];
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
    result = PyTuple_New(OUTPUTS + 2);
    if (result == NULL) goto done;
    for (int j = 0; j < OUTPUTS; j++) {
        if (PyByteArray_Resize(o[j].obj, sizes[j]) < 0) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, j, o[j].obj);
        o[j].obj = NULL;
    }
    /* the hosts' names, each ended by a newline, in id order; whether each was followed */
    {
        Py_ssize_t total = 0;
        for (int j = 0; j < hosts->n; j++) total += hosts->len[j] + 1;
        PyObject *names = PyBytes_FromStringAndSize(NULL, total);
        PyObject *followed = PyBytes_FromStringAndSize((const char *)hosts->followed, hosts->n);
        if (names == NULL || followed == NULL) {
            Py_XDECREF(names);
            Py_XDECREF(followed);
            Py_CLEAR(result);
            goto done;
        }
        char *w = PyBytes_AS_STRING(names);
        for (int j = 0; j < hosts->n; j++) {
            memcpy(w, hosts->text[j], hosts->len[j]);
            w += hosts->len[j];
            *w++ = '\n';
        }
        PyTuple_SET_ITEM(result, OUTPUTS, names);
        PyTuple_SET_ITEM(result, OUTPUTS + 1, followed);
    }
done:
    for (int j = 0; j < OUTPUTS; j++) Py_XDECREF(o[j].obj);
    memo_free(&memo);
    free(starts.v);
    free(dirty_v.v);
    free(glued_v.v);
    free(glued);
    free(hosts);
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

/* ---- label keys (bulk_labels.Labels.ids_of's grouping) */

/* Whether text starts with a logger record's timestamp then " [" (bulk_labels.STAMPED). */
static int stamped(const uint8_t *t, Py_ssize_t len) {
    static const char stamp[] = "[0000-00-00 00:00:00,000] [";
    if (len < (Py_ssize_t)sizeof stamp - 1) return 0;
    for (size_t j = 0; j + 1 < sizeof stamp; j++) {
        if (stamp[j] == '0' ? (t[j] < '0' || t[j] > '9') : t[j] != (uint8_t)stamp[j]) return 0;
    }
    return 1;
}

/* label_keys(data, begins, ends, exact=False): the rows' texts data[begin:end] grouped by
 * Labels.id_of's cache key (the text less a logger record's timestamp, stamped and plain texts
 * apart; exact: the texts themselves): the first row of each key in the order keys first
 * occur, and each row's key number. */
static PyObject *label_keys(PyObject *self, PyObject *args) {
    Py_buffer view, bview, eview;
    int exact = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*|p", &view, &bview, &eview, &exact)) return NULL;
    PyObject *result = NULL, *firsts = NULL, *inverse = NULL;
    Py_ssize_t rows = bview.len / (Py_ssize_t)sizeof(int64_t), keys = 0, size = 16;
    const int64_t *begins = bview.buf, *ends = eview.buf;
    const uint8_t *d = view.buf;
    int64_t *table = NULL;
    if (eview.len != bview.len) {
        PyErr_SetString(PyExc_ValueError, "one end per begin");
        goto done;
    }
    for (Py_ssize_t j = 0; j < rows; j++) {
        if (begins[j] < 0 || ends[j] < begins[j] || ends[j] > view.len) {
            PyErr_SetString(PyExc_ValueError, "a text outside the data");
            goto done;
        }
    }
    while (size < 2 * rows) size *= 2;
    firsts = PyByteArray_FromStringAndSize(NULL, rows ? rows * 8 : 1);
    inverse = PyByteArray_FromStringAndSize(NULL, rows ? rows * 8 : 1);
    table = malloc(size * sizeof(int64_t));
    if (firsts == NULL || inverse == NULL || table == NULL) {
        if (table == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *first = (int64_t *)PyByteArray_AS_STRING(firsts);
    int64_t *inv = (int64_t *)PyByteArray_AS_STRING(inverse);
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t j = 0; j < size; j++) table[j] = -1;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *t = d + begins[r];
        Py_ssize_t len = ends[r] - begins[r];
        int st = !exact && stamped(t, len);
        const uint8_t *k = t + 26 * st;
        Py_ssize_t klen = len - 26 * st;
        uint64_t h = 1469598103934665603ull ^ (uint64_t)st;
        for (Py_ssize_t j = 0; j < klen; j++) h = (h ^ k[j]) * 1099511628211ull;
        Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(size - 1));
        for (;; slot = (slot + 1) & (size - 1)) {
            int64_t found = table[slot];
            if (found < 0) {
                table[slot] = keys;
                first[keys] = r;
                inv[r] = keys++;
                break;
            }
            const uint8_t *other = d + begins[first[found]];
            Py_ssize_t olen = ends[first[found]] - begins[first[found]];
            int ost = !exact && stamped(other, olen);
            if (ost == st && olen - 26 * ost == klen && memcmp(other + 26 * ost, k, klen) == 0) {
                inv[r] = found;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS;
    if (PyByteArray_Resize(firsts, keys * 8) < 0 || PyByteArray_Resize(inverse, rows * 8) < 0)
        goto done;
    result = PyTuple_Pack(2, firsts, inverse);
done:
    Py_XDECREF(firsts);
    Py_XDECREF(inverse);
    free(table);
    PyBuffer_Release(&view);
    PyBuffer_Release(&bview);
    PyBuffer_Release(&eview);
    return result;
}

/* ---- exact grouped sums (series.grouped_sums) */

/* A signed 128-bit integer as a Python int. */
static PyObject *long_of(__int128 v) {
    PyObject *high = PyLong_FromLongLong((long long)(v >> 64));
    PyObject *low = PyLong_FromUnsignedLongLong((unsigned long long)(v & 0xffffffffffffffffULL));
    PyObject *sixty_four = PyLong_FromLong(64), *shifted = NULL, *sum = NULL;
    if (high && low && sixty_four) shifted = PyNumber_Lshift(high, sixty_four);
    if (shifted) sum = PyNumber_Add(shifted, low);
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(sixty_four);
    Py_XDECREF(shifted);
    return sum;
}

typedef struct {
    int64_t group;
    int exponent;
    __int128 sum, weighted;
} Bucket;

/* Sums of mantissas per (group, exponent), in the order the pairs first occur. */
typedef struct {
    Bucket *buckets;
    int32_t *table;
    Py_ssize_t used, size;
    int32_t last; /* the bucket last added to: runs of one group and exponent skip the hash */
} Sums;

static inline Py_ssize_t bucket_slot(int64_t group, int e, Py_ssize_t size) {
    uint64_t h = ((uint64_t)group * 0x9E3779B97F4A7C15ULL) ^ (uint64_t)(e + 4096);
    h *= 0xC2B2AE3D27D4EB4FULL;
    return (Py_ssize_t)(h >> 40) & (size - 1);
}

static int sums_init(Sums *t) {
    t->used = 0;
    t->size = 64;
    t->last = -1;
    t->buckets = malloc(t->size / 2 * sizeof(Bucket));
    t->table = malloc(t->size * sizeof(int32_t));
    if (t->buckets == NULL || t->table == NULL) return -1;
    for (Py_ssize_t j = 0; j < t->size; j++) t->table[j] = -1;
    return 0;
}

static void sums_free(Sums *t) {
    free(t->buckets);
    free(t->table);
}

/* value (finite) at index into group's sums; -1 out of memory */
static int sums_add(Sums *t, int64_t group, double value, int64_t index) {
    int e;
    int64_t m;
    /* any exact split gives the same sums: whole numbers (byte counts) as m * 2**0, the rest
     * by frexp's 53-bit mantissa */
    if (fabs(value) < 9007199254740992.0 && value == (double)(int64_t)value) {
        m = (int64_t)value;
        e = 53;
    } else {
        m = (int64_t)(frexp(value, &e) * 9007199254740992.0); /* 2**53: exact */
    }
    if (t->last >= 0 && t->buckets[t->last].group == group && t->buckets[t->last].exponent == e) {
        t->buckets[t->last].sum += m;
        t->buckets[t->last].weighted += (__int128)m * index;
        return 0;
    }
    Py_ssize_t slot = bucket_slot(group, e, t->size);
    for (;; slot = (slot + 1) & (t->size - 1)) {
        int32_t b = t->table[slot];
        if (b >= 0 && (t->buckets[b].group != group || t->buckets[b].exponent != e)) continue;
        if (b < 0) {
            if (2 * (t->used + 1) > t->size) { /* grow, place all again, then this one */
                Py_ssize_t bigger = 2 * t->size;
                int32_t *table = malloc(bigger * sizeof(int32_t));
                Bucket *more = realloc(t->buckets, bigger / 2 * sizeof(Bucket));
                if (more) t->buckets = more;
                if (table == NULL || more == NULL) {
                    free(table);
                    return -1;
                }
                free(t->table);
                t->table = table;
                t->size = bigger;
                for (Py_ssize_t j = 0; j < bigger; j++) table[j] = -1;
                for (Py_ssize_t k = 0; k < t->used; k++) {
                    Py_ssize_t at = bucket_slot(t->buckets[k].group, t->buckets[k].exponent, bigger);
                    while (table[at] >= 0) at = (at + 1) & (bigger - 1);
                    table[at] = (int32_t)k;
                }
                slot = bucket_slot(group, e, bigger);
                while (table[slot] >= 0) slot = (slot + 1) & (bigger - 1);
            }
            b = (int32_t)t->used++;
            t->buckets[b] = (Bucket){group, e, 0, 0};
            t->table[slot] = b;
        }
        t->buckets[b].sum += m;
        t->buckets[b].weighted += (__int128)m * index;
        t->last = b;
        return 0;
    }
}

/* [(group, e, sum, weighted), ...] */
static PyObject *sums_list(const Sums *t) {
    PyObject *result = PyList_New(t->used);
    for (Py_ssize_t k = 0; k < t->used && result; k++) {
        PyObject *sum = long_of(t->buckets[k].sum), *weighted = long_of(t->buckets[k].weighted);
        PyObject *item = sum && weighted ? Py_BuildValue("(LiOO)", (long long)t->buckets[k].group,
                                                         t->buckets[k].exponent, sum, weighted)
                                         : NULL;
        Py_XDECREF(sum);
        Py_XDECREF(weighted);
        if (item == NULL) Py_CLEAR(result);
        else PyList_SET_ITEM(result, k, item);
    }
    return result;
}

/* grouped_sums(groups, values, index): for finite float64 values, each written m * 2**(e-53)
 * with an integer m of at most 53 bits (frexp's, or the value itself and e = 53 for a whole
 * number), the exact sums of m and of index * m per group and exponent: a list of (group, e, sum, weighted) in the order each pair first
 * occurs, every group present at least once (a zero counts, as m = 0).  128-bit sums do not
 * overflow below 2**30 values with indices below 2**40. */
static PyObject *grouped_sums(PyObject *self, PyObject *args) {
    Py_buffer gv, vv, iv;
    if (!PyArg_ParseTuple(args, "y*y*y*", &gv, &vv, &iv)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = vv.len / (Py_ssize_t)sizeof(double);
    const int64_t *groups = gv.buf, *index = iv.buf;
    const double *values = vv.buf;
    Sums t = {0};
    const char *problem = NULL;
    if (gv.len != vv.len || iv.len != vv.len) problem = "one group and one index per value";
    else if (n >= (1 << 30)) problem = "at most 2**30 values at once";
    for (Py_ssize_t i = 0; i < n && !problem; i++)
        if (!isfinite(values[i])) problem = "finite values only";
        else if (index[i] < 0 || index[i] >= (1LL << 40)) problem = "indices from 0 below 2**40";
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        goto done;
    }
    if (sums_init(&t) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (sums_add(&t, groups[i], values[i], index[i]) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    result = sums_list(&t);
done:
    sums_free(&t);
    PyBuffer_Release(&gv);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&iv);
    return result;
}

#include "_scan_apply.h"

static PyMethodDef METHODS[] = {
    {"make_matcher", make_matcher, METH_VARARGS,
     "make_matcher(anchors, bits, pivots): the anchor table, for scan"},
    {"scan", scan, METH_VARARGS,
     "scan(data, block_starts, prev_tail_len, matcher, tqdm_anchors, pivots=True, expected=-1): "
     "the batch's arrays (pivots=False: the anchors by the hash filter alone, the same hits; "
     "expected: about how many hits, room made for them at first; window_bytes: the passes' "
     "window, the same arrays whatever it is)"},
    {"grouped_sums", grouped_sums, METH_VARARGS,
     "grouped_sums(groups, values, index): exact sums of mantissas per group and exponent"},
    {"close_order", close_order, METH_VARARGS,
     "close_order(kind, consumed, stream, open_before): a run's memory samples in closing "
     "order, and what each stream leaves open (bulk_apply._close_order)"},
    {"first_seen", first_seen, METH_VARARGS,
     "first_seen(values): each distinct int64 value's first position, in order, and each "
     "value's group (bulk_apply.first_seen)"},
    {"label_keys", label_keys, METH_VARARGS,
     "label_keys(data, begins, ends, exact=False): each key's first row and each row's key "
     "(Labels.ids_of; exact: by the texts themselves)"},
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
        {"FLUSH_LINE", FLUSH_LINE}, {"PROGRESS", PROGRESS},
        {"TASK_ROLE", TASK_ROLE},   {"NO_KEY", NO_KEY},
        {"UNSURE", UNSURE},         {"DEFAULT_ROLE", DEFAULT_ROLE},
        {"LABEL_WINDOW", LABEL_WINDOW}, {"LABEL_LINES", LABEL_LINES},
        {"MAX_LINE_BYTES", MAX_LINE_BYTES}, {"DS_MEMORY", B_DS_MEMORY},
        {"DS_CPU", B_DS_CPU},       {"FLUSH", B_FLUSH},
        {"STEP", B_STEP},           {"HEAD", HEAD},
        {"HOST_ROLE", HOST_ROLE},   {"MAX_HOSTS", MAX_HOSTS},
    };
    for (size_t j = 0; j < sizeof shared / sizeof shared[0]; j++) {
        if (PyModule_AddObject(module, shared[j].name, PyLong_FromLongLong(shared[j].value)) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
