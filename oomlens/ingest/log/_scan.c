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

/* ---- byte classes (bulk.py's tables) */

static uint8_t DIGIT[256], HOSTC[256], LETTER[256], NOT_AFTER_BRACKET[256], ENDS_AT_ONCE[256];
static uint8_t DIGIT_OR_SPACE[256], NAME[256], LR_CLASS[256], MOM_CLASS[256];

static void set_chars(uint8_t *table, const char *chars) {
    for (const char *c = chars; *c; c++) table[(uint8_t)*c] = 1;
}

static void init_tables(void) {
    const char *letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    set_chars(DIGIT, "0123456789");
    set_chars(LETTER, letters);
    set_chars(HOSTC, letters);
    set_chars(HOSTC, "0123456789._-");
    set_chars(DIGIT_OR_SPACE, " 0123456789");
    set_chars(NAME, letters);
    set_chars(NAME, "_");
    set_chars(LR_CLASS, "-0123456789.eE+, ");
    set_chars(MOM_CLASS, "-0123456789.eE+, ()");
    for (int b = 0; b < 256; b++) {
        NOT_AFTER_BRACKET[b] = !(LETTER[b] || DIGIT[b] || b == '_');
        ENDS_AT_ONCE[b] = !(b == '[' || b == '(' || b == ' ' || DIGIT[b] || LETTER[b] || b == '\r' ||
                            b == 0x1b || b == 0);
    }
}

/* ---- line heads and stream keys (bulk.line_keys, bulk._no_prefix) */

static inline void head_of(const uint8_t *d, Py_ssize_t n, Py_ssize_t s, uint8_t *h) {
    Py_ssize_t avail = n - s;
    if (avail >= HEAD) {
        memcpy(h, d + s, HEAD);
    } else {
        if (avail > 0) memcpy(h, d + s, avail);
        memset(h + (avail > 0 ? avail : 0), '\n', HEAD - (avail > 0 ? avail : 0));
    }
}

static inline int at(const uint8_t *h, Py_ssize_t col) { return h[col < HEAD - 1 ? col : HEAD - 1]; }

static inline int run_of(const uint8_t *table, const uint8_t *h, int first, int most) {
    int count = 0;
    for (int j = first; j < first + most && j < HEAD; j++) {
        if (!table[h[j]]) break;
        count++;
    }
    return count;
}

static int no_prefix(const uint8_t *h) {
    int first = h[0];
    if (first == '[') {
        int dated = run_of(DIGIT, h, 1, 4) == 4 && h[5] == '-';
        return dated || NOT_AFTER_BRACKET[h[1]];
    }
    if (DIGIT_OR_SPACE[first]) {
        static const uint8_t SPACE[256] = {[' '] = 1};
        int spaces = run_of(SPACE, h, 0, 5);
        int digits = spaces < 5 ? run_of(DIGIT, h, spaces, 6) : 0;
        int colon = spaces + digits;
        int srun = spaces <= 4 && digits >= 1 && digits <= 5 && at(h, colon) == ':' &&
                   at(h, colon + 1) == ' ';
        return !srun;
    }
    if (LETTER[first]) {
        int r = run_of(HOSTC, h, 0, HEAD);
        int host_like = at(h, r) == ':' && at(h, r + 1) == ' ';
        return r < HEAD - 2 && !host_like;
    }
    return ENDS_AT_ONCE[first];
}

static void line_key(const uint8_t *h, int64_t *key, int64_t *prefix_len) {
    *key = UNSURE;
    *prefix_len = 0;
    int prefixed = 0;
    if (h[0] == '[') {
        int start = -1;
        int64_t base = 0;
        if (h[1] == 'r' && h[2] == 'a' && h[3] == 'n' && h[4] == 'k') {
            start = 5;
        } else if (memcmp(h + 1, "default", 7) == 0) {
            start = 8;
            base = DEFAULT_ROLE;
        }
        if (start > 0) {
            int count = run_of(DIGIT, h, start, 7);
            int64_t value = 0;
            for (int j = 0; j < count && j < 6; j++) value = value * 10 + (h[start + j] - '0');
            int close = start + count;
            if (count >= 1 && count <= 6 && at(h, close) == ']' && at(h, close + 1) == ':') {
                int end = close + 2;
                end += at(h, end) == ' ';
                int after = at(h, end);
                int fast = !(after == '[' || after == '(');
                int dated = after == '[' && end + 6 < HEAD && at(h, end + 5) == '-';
                for (int j = 1; j < 5; j++) dated = dated && DIGIT[at(h, end + j)];
                if (fast || dated) *key = base + value;
                *prefix_len = end;
                prefixed = 1;
            }
        }
    }
    if (!prefixed && no_prefix(h)) *key = NO_KEY;
    uint64_t words[HEAD / 8];
    memcpy(words, h, HEAD);
    if ((words[0] | words[1] | words[2] | words[3]) & 0x8080808080808080ull) *key = UNSURE;
}

/* ---- the shapes (bulk._BODIES): one-pass matchers over a line's bytes, its newline included */

typedef struct {
    const uint8_t *p, *e;
} Cur;

static inline int lit_n(Cur *c, const char *s, size_t n) {
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, s, n) != 0) return 0;
    c->p += n;
    return 1;
}

static inline int span(Cur *c, const uint8_t *table) {
    int n = 0;
    while (c->p < c->e && table[*c->p]) {
        c->p++;
        n++;
    }
    return n;
}

static inline int spaces(Cur *c) {
    int n = 0;
    while (c->p < c->e && *c->p == ' ') {
        c->p++;
        n++;
    }
    return n;
}

/* `\n?$` */
static inline int at_end(const Cur *c) {
    return c->p == c->e || (c->p + 1 == c->e && *c->p == '\n');
}

/* `\d{1,most}`: the digits' value (at most 19 digits are asked for) */
static inline int digits(Cur *c, int most, int64_t *value) {
    const uint8_t *start = c->p;
    int n = span(c, DIGIT);
    if (n < 1 || n > most) return 0;
    int64_t v = 0;
    for (int j = 0; j < n; j++) v = v * 10 + (start[j] - '0');
    *value = v;
    return 1;
}

static locale_t C_LOCALE;
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* `\d{1,whole}(?:\.\d{1,frac})?` as float64, correctly rounded (as Arrow's cast and float()):
 * a mantissa below 2**53 over a power of ten up to 1e22 is one correctly rounded division of
 * two exact numbers; longer texts go to strtod_l in the C locale. */
static int decimal(Cur *c, int whole, int frac, double *value) {
    const uint8_t *start = c->p;
    int n = span(c, DIGIT);
    if (n < 1 || n > whole) return 0;
    int k = 0;
    if (c->p < c->e && *c->p == '.') {
        const uint8_t *dot = c->p;
        c->p++;
        k = span(c, DIGIT);
        if (k < 1 || k > frac) {
            c->p = dot;
            return 0;
        }
    }
    const uint8_t *end = c->p;
    if (n + k <= 15) {
        uint64_t m = 0;
        for (const uint8_t *q = start; q < end; q++)
            if (*q != '.') m = m * 10 + (*q - '0');
        *value = (double)m / POW10[k];
        return 1;
    }
    char buffer[64];
    size_t len = (size_t)(end - start);
    if (len >= sizeof buffer) return 0;
    memcpy(buffer, start, len);
    buffer[len] = 0;
    *value = strtod_l(buffer, NULL, C_LOCALE);
    return 1;
}

static inline int64_t gib(double v) { return (int64_t)rint(v * 1073741824.0); }

static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* `\[(YYYY-mm-dd HH:MM:SS,mmm)\] `: microseconds since 1970 and whether the date is valid
 * (bulk._timestamps) */
static int timestamp(Cur *c, int64_t *micros, int *valid) {
    static const char *SHAPE = "[0000-00-00 00:00:00,000] ";
    if (c->e - c->p < 26) return 0;
    int64_t d[23];
    for (int j = 0; j < 26; j++) {
        uint8_t b = c->p[j];
        if (SHAPE[j] == '0') {
            if (!DIGIT[b]) return 0;
            d[j - 1] = b - '0';
        } else if (b != (uint8_t)SHAPE[j]) {
            return 0;
        }
    }
    c->p += 26;
#define NUM2(i) (d[i] * 10 + d[i + 1])
    int64_t year = d[0] * 1000 + d[1] * 100 + d[2] * 10 + d[3];
    int64_t month = NUM2(5), day = NUM2(8), hour = NUM2(11), minute = NUM2(14),
            second = NUM2(17), milli = d[20] * 100 + d[21] * 10 + d[22];
#undef NUM2
    static const int DAYS[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    int64_t limit = (month == 2 && !leap) ? 28 : DAYS[month < 0 ? 0 : month > 12 ? 12 : month];
    *valid = year >= 1 && month >= 1 && month <= 12 && day >= 1 && day <= limit && hour < 24 &&
             minute < 60 && second < 60;
    int64_t y = year - (month <= 2);
    int64_t era = floor_div(y, 400);
    int64_t yoe = y - era * 400;
    int64_t doy = floor_div(153 * (month + (month > 2 ? -3 : 9)) + 2, 5) + day - 1;
    int64_t doe = yoe * 365 + floor_div(yoe, 4) - floor_div(yoe, 100) + doy;
    int64_t days = era * 146097 + doe - 719468;
    *micros = (((days * 24 + hour) * 60 + minute) * 60 + second) * 1000000 + milli * 1000;
    return 1;
}

typedef struct {
    int64_t ts, a, b, c, d;
    double f;
    int valid;
} Fields;

/* `[INFO] [utils.py:\d{1,7}:see_memory_usage] ` after the timestamp */
static int memory_logger(Cur *c) {
    int64_t ignored;
    return lit_n(c, "[INFO] [utils.py:", sizeof "[INFO] [utils.py:" - 1) && digits(c, 7, &ignored) && lit_n(c, ":see_memory_usage] ", sizeof ":see_memory_usage] " - 1);
}

/* ` {1,most}` */
static inline int gap(Cur *c, int most) {
    int n = spaces(c);
    return n >= 1 && n <= most;
}

static int memory_body(Cur *c, Fields *f) {
    double a, b, cc, d;
    if (!(lit_n(c, "MA ", sizeof "MA " - 1) && decimal(c, 9, 6, &a) && lit_n(c, " GB", sizeof " GB" - 1) && gap(c, 40) &&
          lit_n(c, "Max_MA ", sizeof "Max_MA " - 1) && decimal(c, 9, 6, &b) && lit_n(c, " GB", sizeof " GB" - 1) && gap(c, 40) &&
          lit_n(c, "CA ", sizeof "CA " - 1) && decimal(c, 9, 6, &cc) && lit_n(c, " GB", sizeof " GB" - 1) && gap(c, 40) &&
          lit_n(c, "Max_CA ", sizeof "Max_CA " - 1) && decimal(c, 9, 6, &d) && lit_n(c, " GB", sizeof " GB" - 1)))
        return 0;
    spaces(c);
    if (!at_end(c)) return 0;
    f->a = gib(a);
    f->b = gib(b);
    f->c = gib(cc);
    f->d = gib(d);
    return 1;
}

static int cpu_body(Cur *c, Fields *f) {
    double used, percent;
    if (!(lit_n(c, "CPU Virtual Memory:", sizeof "CPU Virtual Memory:" - 1) && gap(c, 10) && lit_n(c, "used = ", sizeof "used = " - 1) &&
          decimal(c, 9, 6, &used) && lit_n(c, " GB, percent = ", sizeof " GB, percent = " - 1) && decimal(c, 3, 6, &percent) &&
          lit_n(c, "%", sizeof "%" - 1)))
        return 0;
    spaces(c);
    if (!at_end(c)) return 0;
    f->a = gib(used);
    f->f = percent;
    return 1;
}

static int flush_line(Cur *c, Fields *f) {
    int64_t ignored;
    if (!(timestamp(c, &f->ts, &f->valid) && lit_n(c, "[WARNING] [stage3.py:", sizeof "[WARNING] [stage3.py:" - 1) &&
          digits(c, 7, &ignored) && lit_n(c, ":", sizeof ":" - 1)))
        return 0;
    int n = span(c, NAME);
    return n >= 1 && n <= 40 && lit_n(c, "] ", sizeof "] " - 1) && digits(c, 12, &f->a) &&
           lit_n(c, " pytorch allocator cache flushes since last step.", sizeof " pytorch allocator cache flushes since last step." - 1);
}

static int step_generic(Cur *c, Fields *f) {
    if (c->e - c->p >= 5 && memcmp(c->p, "rank ", 5) == 0) {
        c->p += 5;
        if (!(digits(c, 6, &f->c) && lit_n(c, " ", sizeof " " - 1))) return 0;
    }
    if (!(lit_n(c, "step ", sizeof "step " - 1) && digits(c, 12, &f->a))) return 0;
    if (c->p < c->e && *c->p == '/') {
        c->p++;
        if (!digits(c, 12, &f->b)) return 0;
    }
    if (!(lit_n(c, " loss ", sizeof " loss " - 1) && decimal(c, 20, 20, &f->f))) return 0;
    if (at_end(c)) return 1;
    double ignored;
    if (lit_n(c, " max reserved ", sizeof " max reserved " - 1)) {
        if (!(decimal(c, 9, 6, &ignored) && lit_n(c, " GiB", sizeof " GiB" - 1))) return 0;
        if (c->p < c->e && *c->p == ' ') {
            c->p++;
            if (!(lit_n(c, "(", sizeof "(" - 1) && decimal(c, 9, 6, &ignored) && lit_n(c, "s)", sizeof "s)" - 1))) return 0;
        }
        return at_end(c);
    }
    return lit_n(c, " (", sizeof " (" - 1) && decimal(c, 9, 6, &ignored) && lit_n(c, "s)", sizeof "s)" - 1) && at_end(c);
}

static int step_ds(Cur *c, Fields *f) {
    int64_t ignored;
    if (!(timestamp(c, &f->ts, &f->valid) && lit_n(c, "[INFO] [logging.py:", sizeof "[INFO] [logging.py:" - 1) &&
          digits(c, 7, &ignored) && lit_n(c, ":log_dist] [Rank ", sizeof ":log_dist] [Rank " - 1)))
        return 0;
    int negative = c->p < c->e && *c->p == '-';
    c->p += negative;
    if (!(digits(c, 6, &f->c) && lit_n(c, "] step=", sizeof "] step=" - 1) && digits(c, 12, &f->a) &&
          lit_n(c, ", skipped=", sizeof ", skipped=" - 1) && digits(c, 12, &f->b) && lit_n(c, ", lr=[", sizeof ", lr=[" - 1)))
        return 0;
    if (negative) f->c = -f->c;
    span(c, LR_CLASS);
    if (!lit_n(c, "], mom=[", sizeof "], mom=[" - 1)) return 0;
    span(c, MOM_CLASS);
    return lit_n(c, "]", sizeof "]" - 1) && at_end(c);
}

/* The shape of `kind` at `c` (after the line's prefix), printed or logged (bulk.shape): true
 * when the line matches, its fields in `f`. */
static int match_shape(int kind, int logger, Cur *c, Fields *f) {
    switch (kind) {
        case MEMORY:
            if (logger && !(timestamp(c, &f->ts, &f->valid) && memory_logger(c))) return 0;
            return memory_body(c, f);
        case CPU:
            if (logger && !(timestamp(c, &f->ts, &f->valid) && memory_logger(c))) return 0;
            return cpu_body(c, f);
        case FLUSH_LINE:
            return logger && flush_line(c, f);
        case STEP_GENERIC:
            return !logger && step_generic(c, f);
        case STEP_DS:
            return logger && step_ds(c, f);
    }
    return 0;
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

/* Every occurrence of the anchors whose pivot pair is at offset q, into (start, anchor)
 * pairs kept sorted by start, then anchor (occurrences come in pivot order, which is at most
 * an anchor's length from start order). */
static int occurrences_of(const Matcher *m, const uint8_t *d, Py_ssize_t n, Py_ssize_t q,
                          uint32_t pair, Vec *starts, Vec *which) {
    for (int32_t k = m->pair_start[pair]; k < m->pair_start[pair + 1]; k++) {
        int32_t a = m->pair_list[k];
        Py_ssize_t s = q - m->pivot[a];
        if (s < 0 || m->len[a] > n - s || memcmp(d + s, m->text[a], m->len[a]) != 0) continue;
        if (vec_push(starts, s) < 0 || vec_push(which, a) < 0) return -1;
        Py_ssize_t j = starts->n - 1;
        while (j > 0 && (starts->v[j - 1] > s || (starts->v[j - 1] == s && which->v[j - 1] > a))) {
            starts->v[j] = starts->v[j - 1];
            which->v[j] = which->v[j - 1];
            j--;
        }
        starts->v[j] = s;
        which->v[j] = a;
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
                                                             Vec *which) {
    const __m128i first = _mm_loadu_si128((const __m128i *)m->first_nibbles);
    const __m128i second = _mm_loadu_si128((const __m128i *)m->second_nibbles);
    Py_ssize_t q = 0;
    for (; q + 17 <= n; q += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(d + q));
        __m128i b = _mm_loadu_si128((const __m128i *)(d + q + 1));
        uint32_t miss = (uint32_t)_mm_movemask_epi8(_mm_or_si128(in_set(a, first), in_set(b, second)));
        uint32_t mask = ~miss & 0xffffu;
        while (mask) {
            if (occurrences_at(m, d, n, q + __builtin_ctz(mask), starts, which) < 0) return -1;
            mask &= mask - 1;
        }
    }
    for (; q + 1 < n; q++)
        if (occurrences_at(m, d, n, q, starts, which) < 0) return -1;
    return 0;
}

static int pivot_search_works(void) { return __builtin_cpu_supports("ssse3"); }
#else
#define HAVE_PIVOT_SEARCH 0
static int pivot_candidates(const Matcher *m, const uint8_t *d, Py_ssize_t n, Vec *starts,
                            Vec *which) {
    return -1;
}
static int pivot_search_works(void) { return 0; }
#endif

/* The same matches as search_hashed, from every occurrence found by the pivots: in start
 * order (then the table's order), each one that starts at or after the end of the last one
 * taken. */
static int search_pivots(const Matcher *m, const uint8_t *d, Py_ssize_t n, Vec *offsets,
                         Vec *bits) {
    Vec starts = {0}, which = {0};
    int failed = pivot_candidates(m, d, n, &starts, &which) < 0;
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
    return PyModule_Create(&MODULE);
}
