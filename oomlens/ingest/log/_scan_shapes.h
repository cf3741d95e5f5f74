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

static int lightning_digits(const uint8_t *h);

static inline int ray_may_follow(const uint8_t *h, int p) {
    if (p + 5 >= HEAD) return 1;
    return memcmp(h + p, "pid=", 4) == 0 || memcmp(h + p, "rank=", 5) == 0;
}

/* Whether a head that opens with `(` is sure to hold no Ray prefix (prefixes._RAY: `(`, an
 * optional `name ` of [A-Za-z_][\w.-]{0,60}, an optional `rank=N, `, then `pid=`): neither
 * right after the parenthesis nor after a first word and a space comes `pid=` or `rank=`.  A
 * byte past ASCII in that word (which `\w` may match) leaves it unsure. */
static int not_ray(const uint8_t *h) {
    if (ray_may_follow(h, 1)) return 0;
    if (LETTER[h[1]] || h[1] == '_') {
        int w = 1;
        while (w < 61 && 1 + w < HEAD && (HOSTC[h[1 + w]] || h[1 + w] == '_')) w++;
        if (1 + w >= HEAD - 1) return 0;
        int stop = h[1 + w];
        if (stop >= 0x7F || (stop == ' ' && ray_may_follow(h, 2 + w))) return 0;
    }
    return 1;
}

static int no_prefix(const uint8_t *h) {
    int first = h[0];
    if (first == '[') {
        if (lightning_digits(h)) return 0; /* prefixes._LIGHTNING */
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
    if (first == '(') return not_ray(h);
    return ENDS_AT_ONCE[first];
}

/* Lightning's `[rank: N] ` (lightning_utilities' rank_prefixed_message): the digits' count
 * (1-6), 0 when the head does not open with it (prefixes._LIGHTNING). */
static int lightning_digits(const uint8_t *h) {
    if (memcmp(h, "[rank: ", 7) != 0) return 0;
    int count = run_of(DIGIT, h, 7, 7);
    return count >= 1 && count <= 6 && at(h, 7 + count) == ']' && at(h, 8 + count) == ' ' ? count
                                                                                          : 0;
}

/* Whether a head opens with what prefixes._KNOWN_NEXT matches after a host: an MPI tag, a
 * role's `[nameN]:`, a logger's `[YYYY-MM-DD `, srun's `N: ` (no leading space). */
static int known_next(const uint8_t *h) {
    if (h[0] == '[') {
        int a = run_of(DIGIT, h, 1, 7);
        if (a >= 1 && a <= 6 && at(h, 1 + a) == ',') {
            int b = run_of(DIGIT, h, 2 + a, 7);
            if (b >= 1 && b <= 6 && at(h, 2 + a + b) == ']' && at(h, 3 + a + b) == '<') return 1;
        }
        if (a == 4 && at(h, 5) == '-' && DIGIT[at(h, 6)] && DIGIT[at(h, 7)] && at(h, 8) == '-' &&
            DIGIT[at(h, 9)] && DIGIT[at(h, 10)] && at(h, 11) == ' ')
            return 1;
        if (LETTER[h[1]] || h[1] == '_') {
            int name = 1;
            while (name < 31 && (LETTER[at(h, 1 + name)] || at(h, 1 + name) == '_' ||
                                 at(h, 1 + name) == '-'))
                name++;
            int digits = run_of(DIGIT, h, 1 + name, 7);
            if (digits >= 1 && digits <= 6 && at(h, 1 + name + digits) == ']' &&
                at(h, 2 + name + digits) == ':')
                return 1;
        }
        return 0;
    }
    int digits = run_of(DIGIT, h, 0, 6);
    return digits >= 1 && digits <= 5 && at(h, digits) == ':' && at(h, digits + 1) == ' ';
}

/* pdsh's `host: ` (prefixes._HOST): the hosts of a batch, each under one id (HOST_ROLE *
 * (id + 1) + inner key + 1 is the key of a line with the host and an inner key), and whether
 * a line of it was followed by a known prefix (prefixes.strip_prefixes then remembers it in
 * known_hosts). */
#define MAX_HOSTS 1024
#define HOST_ROLE (1LL << 26)
#define HOST_SLOTS (2 * MAX_HOSTS)

typedef struct {
    const uint8_t *text[MAX_HOSTS];
    uint8_t len[MAX_HOSTS];
    uint8_t followed[MAX_HOSTS];
    int16_t slot[HOST_SLOTS]; /* id + 1, 0: empty */
    int n;
} Hosts;

/* The id of the host name t[0..len), made if new; -1 when the table is full. */
static int host_id(Hosts *hosts, const uint8_t *t, int len) {
    uint64_t hash = 1469598103934665603ull;
    for (int j = 0; j < len; j++) hash = (hash ^ t[j]) * 1099511628211ull;
    for (int slot = (int)(hash & (HOST_SLOTS - 1));; slot = (slot + 1) & (HOST_SLOTS - 1)) {
        int id = hosts->slot[slot] - 1;
        if (id < 0) {
            if (hosts->n == MAX_HOSTS) return -1;
            id = hosts->n++;
            hosts->text[id] = t;
            hosts->len[id] = (uint8_t)len;
            hosts->followed[id] = 0;
            hosts->slot[slot] = (int16_t)(id + 1);
            return id;
        }
        if (hosts->len[id] == len && memcmp(hosts->text[id], t, len) == 0) return id;
    }
}

static int ends_with(const uint8_t *t, int len, const char *suffix) {
    int k = (int)strlen(suffix);
    return len >= k && memcmp(t + len - k, suffix, k) == 0;
}

/* prefixes._looks_like_host: a name strip_prefixes takes for a host whatever the lines before
 * (with a digit or a hyphen, not an exception's, a warning's or a program's name). The names
 * it takes only once seen before a known prefix (known_hosts) are left to it. */
static int looks_like_host(const uint8_t *t, int len) {
    static const char *const SUFFIXES[] = {"Error", "Exception", "Warning", "Exit", "Interrupt",
                                           "Iteration"};
    for (size_t j = 0; j < sizeof SUFFIXES / sizeof SUFFIXES[0]; j++)
        if (ends_with(t, len, SUFFIXES[j])) return 0;
    uint8_t low[64];
    int marked = 0;
    for (int j = 0; j < len; j++) {
        low[j] = t[j] >= 'A' && t[j] <= 'Z' ? t[j] + 32 : t[j];
        marked |= DIGIT[t[j]] || t[j] == '-';
    }
    if (len >= 6 && memcmp(low, "python", 6) == 0) return 0;
    if (ends_with(low, len, ".py") || ends_with(low, len, ".sh")) return 0;
    return marked;
}

/* The stream key and prefix length of the line at s (head h: its first HEAD bytes): `[rankN]:`
 * and `[defaultN]:` (bulk_keys.line_keys), Lightning's `[rank: N] ` (N, as `[rankN]:`), srun's
 * `  N: ` (TASK_ROLE + N) when the rest holds no further prefix, pdsh's `host: ` before any
 * of those (hosts given: HOST_ROLE, see Hosts; *followed: whether a known prefix follows it),
 * NO_KEY for a line with none, UNSURE where prefixes.strip_prefixes must say.  No hosts given:
 * the line's rest after a host, which strip_prefixes reads in its loop (not by its one match
 * of the common `[rankN]:` at a line's start): a prefix after any there makes it unsure. */
static void line_key(const uint8_t *d, Py_ssize_t n, Py_ssize_t s, const uint8_t *h, int64_t *key,
                     int64_t *prefix_len, Hosts *hosts, int *followed) {
    *key = UNSURE;
    *prefix_len = 0;
    if (followed != NULL) *followed = 0;
    int prefixed = 0;
    int lightning = lightning_digits(h);
    if (lightning) {
        int64_t value = 0;
        for (int j = 0; j < lightning; j++) value = value * 10 + (h[7 + j] - '0');
        uint8_t rest[HEAD];
        head_of(d, n, s + 9 + lightning, rest);
        if (no_prefix(rest)) *key = value;
        *prefix_len = 9 + lightning;
        prefixed = 1;
    } else if (hosts != NULL && LETTER[h[0]]) {
        Py_ssize_t r = 1;
        while (r < 64 && s + r < n && HOSTC[d[s + r]]) r++;
        if (r < 64 && s + r + 1 < n && d[s + r] == ':' && d[s + r + 1] == ' ' &&
            looks_like_host(d + s, (int)r)) {
            uint8_t rest[HEAD];
            head_of(d, n, s + r + 2, rest);
            int64_t inner, inner_len;
            line_key(d, n, s + r + 2, rest, &inner, &inner_len, NULL, NULL);
            int id = inner == UNSURE ? -1 : host_id(hosts, d + s, (int)r);
            if (id >= 0) {
                *key = HOST_ROLE * (id + 1) + inner + 1;
                if (followed != NULL) *followed = known_next(rest);
            }
            *prefix_len = r + 2 + inner_len;
            return;
        }
    }
    if (!prefixed && h[0] == '[') {
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
                int fast = after != '[';
                if (after == '(') {
                    uint8_t rest[HEAD];
                    head_of(d, n, s + end, rest);
                    fast = not_ray(rest);
                }
                int dated = after == '[' && end + 6 < HEAD && at(h, end + 5) == '-';
                for (int j = 1; j < 5; j++) dated = dated && DIGIT[at(h, end + j)];
                if (hosts == NULL) {
                    uint8_t rest[HEAD];
                    head_of(d, n, s + end, rest);
                    if (no_prefix(rest)) *key = base + value;
                } else if (fast || dated) {
                    *key = base + value;
                }
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
