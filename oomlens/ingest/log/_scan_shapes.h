/* Byte classes, line heads and stream keys, and the shapes' one-pass matchers, for _scan.c
 * (one translation unit: included once, after its constants). */
#ifndef OOMLENS_SCAN_SHAPES_H
#define OOMLENS_SCAN_SHAPES_H

/* ---- byte classes (bulk.py's tables) */

static uint8_t DIGIT[256], HOSTC[256], LETTER[256], ENDS_AT_ONCE[256];
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
        ENDS_AT_ONCE[b] = !(b == '[' || b == '(' || b == ' ' || DIGIT[b] || LETTER[b] || b == '\r' ||
                            b == 0x1b || b == 0);
    }
}

/* ---- line heads and stream keys (bulk_keys.line_keys, bulk_keys._no_prefix) */

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
        /* prefixes._ROLE `\[[A-Za-z_][A-Za-z_-]{0,30}?\d{1,6}\]:` and prefixes._MPI
         * `\[\d{1,6},\d{1,6}\]<`: the only prefixes that open with a bracket */
        static const uint8_t ROLE_NAME[256] = {['-'] = 1};
        int letters = LETTER[h[1]] || h[1] == '_' ? 1 : 0;
        while (letters > 0 && letters < 31 &&
               (LETTER[at(h, 1 + letters)] || at(h, 1 + letters) == '_' ||
                ROLE_NAME[at(h, 1 + letters)]))
            letters++;
        int digits = run_of(DIGIT, h, 1 + letters, 7);
        if (1 + letters + digits + 2 >= HEAD) return 0; /* past the head: not sure */
        if (digits >= 1 && digits <= 6) {
            int after = 1 + letters + digits;
            if (letters && at(h, after) == ']' && at(h, after + 1) == ':') return 0;
            if (!letters && at(h, after) == ',') return 0;
        }
        return 1;
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

/* The stream key and prefix length of the line at s (head h: its first HEAD bytes): `[rankN]:`
 * and `[defaultN]:` (bulk_keys.line_keys), srun's `  N: ` (TASK_ROLE + N) when the rest holds
 * no further prefix, NO_KEY for a line with none, UNSURE where prefixes.strip_prefixes must
 * say. */
static void line_key(const uint8_t *d, Py_ssize_t n, Py_ssize_t s, const uint8_t *h, int64_t *key,
                     int64_t *prefix_len) {
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
    if (!prefixed && DIGIT_OR_SPACE[h[0]]) { /* prefixes._SRUN ` {0,4}(\d{1,5}): ` */
        static const uint8_t SPACE[256] = {[' '] = 1};
        int spaces = run_of(SPACE, h, 0, 5);
        int digits = spaces < 5 ? run_of(DIGIT, h, spaces, 6) : 0;
        int colon = spaces + digits;
        if (spaces <= 4 && digits >= 1 && digits <= 5 && at(h, colon) == ':' &&
            at(h, colon + 1) == ' ') {
            int64_t value = 0;
            for (int j = spaces; j < colon; j++) value = value * 10 + (h[j] - '0');
            uint8_t rest[HEAD];
            head_of(d, n, s + colon + 2, rest);
            if (no_prefix(rest)) *key = TASK_ROLE + value;
            *prefix_len = colon + 2;
            prefixed = 1;
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
 * (bulk_arrow.timestamps) */
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
    int64_t e, h;
    double g;
} Fields;

#endif
