/* Progress lines read whatever else they hold, for _scan.c (one translation unit: included once,
 * after _scan_shapes.h).
 *
 * A line whose anchors are all progress anchors (bits.STEP) is read here the way the per-line
 * path reads it: the message found as LogReader._handle_rest finds it (a DeepSpeed logger
 * record's header and "[Rank N] " tag taken off, deepspeed.parse_logger_line), then
 * steps.parse_step_line's searches over it, in its order: DeepSpeed "step=N, skipped=M",
 * ThroughputTimer "global_step=... MemAllocated=xGB, MaxMemAllocated=yGB" (and the older
 * "N/M, SamplesPerSec=..."), HF Trainer "{'loss': x, ... 'epoch': y}", tqdm "| N/M [mm:ss<",
 * and the generic "step|iter|iteration|global step N[/M]" with the first "loss X" anywhere.
 * Each search is the regular expression of steps.py written out as a scan: the same first match,
 * the same groups.  What the reader cannot be sure of here goes to the per-line path (UNSURE):
 * a leading time in a form other than the logger's, a completion word (matchers._completion),
 * a number float() would read differently. */
#ifndef OOMLENS_SCAN_PROGRESS_H
#define OOMLENS_SCAN_PROGRESS_H

/* forms (StepSample.kind), in Fields.d with flags */
#define FORM_NONE 0
#define FORM_DEEPSPEED 1
#define FORM_THROUGHPUT 2
#define FORM_HF 3
#define FORM_TQDM 4
#define FORM_GENERIC 5
#define FORM_GENERIC_EVAL 6
#define FORM_MASK 15
#define HAS_STEP 16
#define HAS_LOSS 32
#define HAS_EPOCH 64

#define P_READ 1
#define P_UNSURE 0

static inline int lower(int b) { return b >= 'A' && b <= 'Z' ? b + 32 : b; }
static inline int is_word(int b) { return LETTER[b] || DIGIT[b] || b == '_'; }
/* Python's \s on ASCII */
static inline int is_space(int b) { return b == ' ' || (b >= 9 && b <= 13) || (b >= 28 && b <= 31); }

/* text[i..] starts with lit (ASCII, case-insensitively if fold) */
static int starts(const uint8_t *t, Py_ssize_t n, Py_ssize_t i, const char *lit, int fold) {
    for (Py_ssize_t j = 0; lit[j]; j++) {
        if (i + j >= n) return 0;
        int b = t[i + j];
        if ((fold ? lower(b) : b) != (uint8_t)lit[j]) return 0;
    }
    return 1;
}

static Py_ssize_t find(const uint8_t *t, Py_ssize_t n, Py_ssize_t from, const char *lit) {
    size_t len = strlen(lit);
    if (from >= n) return -1;
    const uint8_t *hit = memmem(t + from, (size_t)(n - from), lit, len);
    return hit ? hit - t : -1;
}

/* `\d{1,most}` at i (greedy): digits taken, 0 if none; value of those taken */
static int run_digits(const uint8_t *t, Py_ssize_t n, Py_ssize_t i, int most, int64_t *value) {
    int k = 0;
    int64_t v = 0;
    while (k < most && i + k < n && DIGIT[t[i + k]]) {
        v = v * 10 + (t[i + k] - '0');
        k++;
    }
    *value = v;
    return k;
}

/* float(text[i..j]) as Python reads it (ASCII digits, '.', 'e', sign, nan, inf): 0 when it
 * would raise (the per-line path then decides) */
static int py_float(const uint8_t *t, Py_ssize_t i, Py_ssize_t j, double *value) {
    char buffer[80];
    Py_ssize_t len = j - i;
    if (len <= 0 || len >= (Py_ssize_t)sizeof buffer) return 0;
    memcpy(buffer, t + i, len);
    buffer[len] = 0;
    int dots = 0, digits = 0;
    for (Py_ssize_t k = 0; k < len; k++) {
        dots += buffer[k] == '.';
        digits += DIGIT[(uint8_t)buffer[k]];
    }
    if (dots > 1) return 0; /* "1.2.3" in a [\d.] run: float() raises */
    char *end = NULL;
    *value = strtod_l(buffer, &end, C_LOCALE);
    if (end != buffer + len) return 0;
    if (digits == 0) { /* nan, inf: strtod reads "infinity", "nan(...)" alike; Python too */
        return 1;
    }
    return 1;
}

/* steps._FLOAT at i: `[-+]?(?:\d{1,20}(?:\.\d{0,20})?|\.\d{1,20})(?:[eE][-+]?\d{1,4})?|nan|inf`
 * (case-insensitively when fold); its end, or -1 */
static Py_ssize_t float_at(const uint8_t *t, Py_ssize_t n, Py_ssize_t i, int fold) {
    Py_ssize_t p = i;
    int64_t ignored;
    if (p < n && (t[p] == '-' || t[p] == '+')) p++;
    int k = run_digits(t, n, p, 20, &ignored);
    if (k > 0) {
        p += k;
        if (p < n && t[p] == '.') p += 1 + run_digits(t, n, p + 1, 20, &ignored);
    } else if (p < n && t[p] == '.' && (k = run_digits(t, n, p + 1, 20, &ignored)) > 0) {
        p += 1 + k;
    } else {
        p = -1;
    }
    if (p >= 0) {
        Py_ssize_t q = p;
        if (q < n && (t[q] == 'e' || t[q] == 'E')) {
            q++;
            if (q < n && (t[q] == '-' || t[q] == '+')) q++;
            int e = run_digits(t, n, q, 4, &ignored);
            if (e > 0) p = q + e;
        }
        return p;
    }
    if (starts(t, n, i, "nan", fold) || starts(t, n, i, "inf", fold)) return i + 3;
    return -1;
}

/* after a word: `['"]?\s{0,3}[:=]?\s{0,3}'?` (quotes: whether `['"]?` comes first); the places
 * the value may start, best first (the regex's greedy choice), at most 2 */
static Py_ssize_t separator(const uint8_t *t, Py_ssize_t n, Py_ssize_t p, const char *seps) {
    Py_ssize_t w = 0;
    while (p + w < n && is_space(t[p + w]) && w < 7) w++;
    if (p + w < n && w <= 3 && strchr(seps, t[p + w]) && t[p + w]) {
        p += w + 1;
        Py_ssize_t w2 = 0;
        while (p + w2 < n && is_space(t[p + w2]) && w2 < 4) w2++;
        return w2 <= 3 ? p + w2 : -1;
    }
    return w <= 6 ? p + w : -1;
}

/* ---- steps.parse_step_line's searches */

/* _DS_STEP: `\bstep=(\d{1,12}), skipped=(\d{1,12})` */
static int ds_step(const uint8_t *t, Py_ssize_t n, Fields *f) {
    for (Py_ssize_t at = find(t, n, 0, "step="); at >= 0; at = find(t, n, at + 1, "step=")) {
        if (at > 0 && is_word(t[at - 1])) continue;
        int64_t step, skipped;
        Py_ssize_t p = at + 5;
        int k = run_digits(t, n, p, 12, &step);
        if (k == 0 || !starts(t, n, p + k, ", skipped=", 0)) continue;
        p += k + 10;
        if (run_digits(t, n, p, 12, &skipped) == 0) continue;
        f->a = step;
        f->b = skipped;
        f->d = FORM_DEEPSPEED | HAS_STEP;
        return 1;
    }
    return 0;
}

/* `MemAllocated=([\d.]{1,20})GB, MaxMemAllocated=([\d.]{1,20})GB` at p: 1 read, 0 no match,
 * -1 unsure */
static int mem_fields(const uint8_t *t, Py_ssize_t n, Py_ssize_t p, Fields *f) {
    static const uint8_t NUMC[256] = {['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1,
                                      ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
                                      ['.'] = 1};
    Py_ssize_t q = p + 13, s = q;
    while (q < n && NUMC[t[q]] && q - s < 21) q++;
    if (q == s || q - s > 20 || !starts(t, n, q, "GB, MaxMemAllocated=", 0)) return 0;
    Py_ssize_t m1 = s, m1e = q;
    q += 20;
    s = q;
    while (q < n && NUMC[t[q]] && q - s < 21) q++;
    if (q == s || q - s > 20 || !starts(t, n, q, "GB", 0)) return 0;
    double mem, max;
    if (!py_float(t, m1, m1e, &mem) || !py_float(t, s, q, &max)) return -1;
    f->e = (int64_t)rint(mem * 1073741824.0);
    f->h = (int64_t)rint(max * 1073741824.0);
    return 1;
}

/* _THROUGHPUT, then _OLD_THROUGHPUT: 1 read, 0 no match, -1 unsure */
static int throughput(const uint8_t *t, Py_ssize_t n, Fields *f) {
    for (Py_ssize_t at = find(t, n, 0, "global_step="); at >= 0;
         at = find(t, n, at + 1, "global_step=")) {
        int64_t step;
        Py_ssize_t p = at + 12;
        int k = run_digits(t, n, p, 12, &step);
        if (k == 0) continue;
        p += k;
        /* `[^\n]{0,400}?MemAllocated=`: the first that completes */
        for (Py_ssize_t m = find(t, n, p, "MemAllocated="); m >= 0 && m - p <= 400;
             m = find(t, n, m + 1, "MemAllocated=")) {
            int got = mem_fields(t, n, m, f);
            if (got < 0) return -1;
            if (got) {
                f->a = step;
                f->b = -1;
                f->d = FORM_THROUGHPUT | HAS_STEP;
                return 1;
            }
        }
    }
    /* `(\d{1,12})/(\d{1,12}), SamplesPerSec=[^\n]{0,100}?MemAllocated=...`: leftmost start */
    for (Py_ssize_t at = find(t, n, 0, ", SamplesPerSec="); at >= 0;
         at = find(t, n, at + 1, ", SamplesPerSec=")) {
        Py_ssize_t q = at;
        int tk = 0;
        while (q > 0 && DIGIT[t[q - 1]]) q--, tk++;
        if (tk == 0 || q == 0 || t[q - 1] != '/') continue;
        Py_ssize_t slash = q - 1, s = slash;
        int sk = 0;
        while (s > 0 && DIGIT[t[s - 1]]) s--, sk++;
        if (sk == 0) continue;
        /* the leftmost start: at most 12 digits each (a longer run starts later) */
        if (sk > 12) s = slash - 12, sk = 12;
        if (tk > 12) continue; /* `(\d{1,12}),` cannot end at the comma */
        int64_t step, total;
        run_digits(t, n, s, 12, &step);
        run_digits(t, n, slash + 1, 12, &total);
        Py_ssize_t p = at + 16;
        for (Py_ssize_t m = find(t, n, p, "MemAllocated="); m >= 0 && m - p <= 100;
             m = find(t, n, m + 1, "MemAllocated=")) {
            int got = mem_fields(t, n, m, f);
            if (got < 0) return -1;
            if (got) {
                f->a = step;
                f->b = total;
                f->d = FORM_THROUGHPUT | HAS_STEP;
                return 1;
            }
        }
    }
    return 0;
}

/* _HF: `\{'loss': '?(FLOAT)'?,[^\n]{0,2000}?'epoch': '?(FLOAT)'?`: 1, 0, -1 */
static int hf_dict(const uint8_t *t, Py_ssize_t n, Fields *f) {
    for (Py_ssize_t at = find(t, n, 0, "{'loss': "); at >= 0; at = find(t, n, at + 1, "{'loss': ")) {
        Py_ssize_t p = at + 9;
        p += p < n && t[p] == '\'';
        Py_ssize_t end = float_at(t, n, p, 0);
        if (end < 0) continue;
        /* `'?,` after the float: the float may give back digits for it (never: a digit is
         * neither ' nor ,), so the end stands */
        Py_ssize_t q = end + (end < n && t[end] == '\'');
        if (!(q < n && t[q] == ',')) continue;
        double loss;
        if (!py_float(t, p, end, &loss)) return -1;
        for (Py_ssize_t e = find(t, n, q + 1, "'epoch': "); e >= 0 && e - (q + 1) <= 2000;
             e = find(t, n, e + 1, "'epoch': ")) {
            Py_ssize_t r = e + 9;
            r += r < n && t[r] == '\'';
            Py_ssize_t eend = float_at(t, n, r, 0);
            if (eend < 0) continue;
            double epoch;
            if (!py_float(t, r, eend, &epoch)) return -1;
            f->a = -1;
            f->b = -1;
            f->f = loss;
            f->g = epoch;
            f->d = FORM_HF | HAS_LOSS | HAS_EPOCH;
            return 1;
        }
    }
    return 0;
}

/* _TQDM: `\|\s{0,4}(\d{1,12})/(\d{1,12}) \[(?:\d{1,4}:)?\d{1,4}:\d\d[<,]` */
static int tqdm_bar(const uint8_t *t, Py_ssize_t n, Fields *f) {
    for (Py_ssize_t at = find(t, n, 0, "|"); at >= 0; at = find(t, n, at + 1, "|")) {
        Py_ssize_t p = at + 1;
        int w = 0;
        while (p < n && is_space(t[p]) && w < 4) p++, w++;
        int64_t step, total, ignored;
        int k = run_digits(t, n, p, 12, &step);
        if (k == 0 || !(p + k < n && t[p + k] == '/')) continue;
        p += k + 1;
        k = run_digits(t, n, p, 12, &total);
        if (k == 0 || !starts(t, n, p + k, " [", 0)) continue;
        p += k + 2;
        /* `(?:\d{1,4}:)?\d{1,4}:\d\d[<,]` */
        int ok = 0;
        for (int hours = 1; hours >= 0 && !ok; hours--) {
            Py_ssize_t q = p;
            if (hours) {
                int h = run_digits(t, n, q, 4, &ignored);
                if (h == 0 || !(q + h < n && t[q + h] == ':')) continue;
                q += h + 1;
            }
            int m = run_digits(t, n, q, 4, &ignored);
            if (m == 0 || !(q + m < n && t[q + m] == ':')) continue;
            q += m + 1;
            if (q + 2 < n && DIGIT[t[q]] && DIGIT[t[q + 1]] && (t[q + 2] == '<' || t[q + 2] == ','))
                ok = 1;
        }
        if (!ok) continue;
        f->a = step;
        f->b = total;
        f->d = FORM_TQDM | HAS_STEP;
        return 1;
    }
    return 0;
}

/* _GENERIC_STEP at i (case-insensitive): its end and groups, or -1.
 * `\b(?:global[_ ]step|step|iteration|iter)\b\s{0,3}[:=#]?\s{0,3}\[?(\d{1,12})
 *  (?:\s{0,2}/\s{0,2}(\d{1,12}))?` */
static Py_ssize_t generic_step_at(const uint8_t *t, Py_ssize_t n, Py_ssize_t i, int64_t *step,
                                  int64_t *total) {
    if (i > 0 && is_word(t[i - 1])) return -1;
    static const char *WORDS[] = {"global_step", "global step", "step", "iteration", "iter"};
    Py_ssize_t p = -1;
    for (int w = 0; w < 5 && p < 0; w++) {
        size_t len = strlen(WORDS[w]);
        if (starts(t, n, i, WORDS[w], 1) && !(i + (Py_ssize_t)len < n && is_word(t[i + len])))
            p = i + (Py_ssize_t)len;
    }
    if (p < 0) return -1;
    p = separator(t, n, p, ":=#");
    if (p < 0) return -1;
    p += p < n && t[p] == '[';
    int k = run_digits(t, n, p, 12, step);
    if (k == 0) return -1;
    p += k;
    *total = -1;
    Py_ssize_t q = p;
    int w = 0;
    while (q < n && is_space(t[q]) && w < 2) q++, w++;
    if (q < n && t[q] == '/') {
        q++;
        w = 0;
        while (q < n && is_space(t[q]) && w < 2) q++, w++;
        int64_t value;
        int tk = run_digits(t, n, q, 12, &value);
        if (tk > 0) {
            *total = value;
            p = q + tk;
        }
    }
    return p;
}

/* _GENERIC_LOSS, the first match from 0: its start and the float's span, or -1 */
static Py_ssize_t generic_loss(const uint8_t *t, Py_ssize_t n, Py_ssize_t *from, Py_ssize_t *to) {
    for (Py_ssize_t at = 0; at + 4 <= n; at++) {
        if (lower(t[at]) != 'l' || !starts(t, n, at, "loss", 1)) continue;
        if ((at > 0 && is_word(t[at - 1])) || (at + 4 < n && is_word(t[at + 4]))) continue;
        Py_ssize_t p = at + 4;
        p += p < n && (t[p] == '\'' || t[p] == '"');
        p = separator(t, n, p, ":=");
        if (p < 0) continue;
        Py_ssize_t s = p + (p < n && t[p] == '\'');
        Py_ssize_t e = float_at(t, n, s, 1);
        if (e < 0 && s != p) { /* `'?` may match nothing: the float at p itself */
            s = p;
            e = float_at(t, n, s, 1);
        }
        if (e < 0) continue;
        *from = s;
        *to = e;
        return at;
    }
    return -1;
}

/* _RANK_IN_TEXT in t[0:end]: `\brank[ =:]{0,2}(\d{1,6})\b` (case-insensitive); -1 none */
static int64_t rank_in_text(const uint8_t *t, Py_ssize_t end) {
    for (Py_ssize_t at = 0; at + 4 <= end; at++) {
        if (lower(t[at]) != 'r' || !starts(t, end, at, "rank", 1)) continue;
        if (at > 0 && is_word(t[at - 1])) continue;
        Py_ssize_t p = at + 4;
        for (int seps = 0; seps <= 2; seps++) {
            /* `[ =:]{0,2}` greedy: the longest run first, then shorter */
            int run = 0;
            while (run < 2 && p + run < end && (t[p + run] == ' ' || t[p + run] == '=' ||
                                                 t[p + run] == ':'))
                run++;
            for (int take = run; take >= 0; take--) {
                Py_ssize_t q = p + take;
                int64_t value;
                int k = run_digits(t, end, q, 6, &value);
                /* `\d{1,6}\b`: digits that end at a boundary (a shorter run ends between digits) */
                if (k > 0 && !(q + k < end && is_word(t[q + k]))) return value;
            }
            break;
        }
    }
    return -1;
}

/* the generic branch of parse_step_line: 1 read (maybe FORM_NONE), -1 unsure */
static int generic(const uint8_t *t, Py_ssize_t n, Fields *f) {
    int64_t step = 0, total = -1;
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int b = lower(t[i]);
        if ((b == 'g' || b == 's' || b == 'i') && generic_step_at(t, n, i, &step, &total) >= 0) {
            at = i;
            break;
        }
    }
    if (at < 0) return 1;
    Py_ssize_t ls, le;
    Py_ssize_t loss_at = generic_loss(t, n, &ls, &le);
    if (loss_at >= 0) {
        int eval = 0;
        for (Py_ssize_t j = 0; j + 4 <= loss_at && !eval; j++)
            eval = starts(t, loss_at, j, "eval", 1) || starts(t, loss_at, j, "val_", 0);
        if (eval) {
            f->a = step;
            f->b = -1;
            f->d = FORM_GENERIC_EVAL | HAS_STEP;
            return 1;
        }
    }
    if (loss_at < 0 && total < 0) return 1;
    if (loss_at >= 0) {
        double loss;
        if (!py_float(t, ls, le, &loss)) return -1;
        f->f = loss;
        f->d |= HAS_LOSS;
    }
    f->a = step;
    f->b = total;
    f->c = rank_in_text(t, at);
    f->d |= FORM_GENERIC | HAS_STEP;
    return 1;
}

static int has(const uint8_t *t, Py_ssize_t n, const char *lit) { return find(t, n, 0, lit) >= 0; }

/* steps.parse_step_line over the message t[0:n]: 1 read (FORM_NONE: nothing), -1 unsure */
static int parse_progress(const uint8_t *t, Py_ssize_t n, Fields *f) {
    if (ds_step(t, n, f)) return 1;
    if (has(t, n, "MemAllocated=")) {
        int got = throughput(t, n, f);
        if (got) return got;
    }
    if (has(t, n, "'loss'")) {
        int got = hf_dict(t, n, f);
        if (got) return got;
    }
    if ((has(t, n, "/s]") || has(t, n, "s/it]") || has(t, n, "<")) && tqdm_bar(t, n, f)) return 1;
    return generic(t, n, f);
}

/* Whether leading_timestamp could find a time at the start of t (its forms' first bytes:
 * ISO at 0 or 1, glog, dmesg -T, syslog): then the per-line path reads the line. */
static int maybe_time(const uint8_t *t, Py_ssize_t n) {
    if (n == 0 || !strchr("[0123456789IWEF", t[0])) return 0;
    for (int at = 0; at <= 1; at++) { /* `\[?\d{4}-` at 0, or at 1 */
        Py_ssize_t p = at + (at + 0 < n && t[at] == '[');
        if (p + 4 < n && DIGIT[t[p]] && DIGIT[t[p + 1]] && DIGIT[t[p + 2]] && DIGIT[t[p + 3]] &&
            t[p + 4] == '-')
            return 1;
    }
    Py_ssize_t p = t[0] == '[';
    if (p + 2 < n && strchr("IWEF", t[p]) && t[p] && DIGIT[t[p + 1]] && DIGIT[t[p + 2]]) return 1;
    if (t[0] == '[' && n > 4 && is_word(t[1]) && is_word(t[2]) && is_word(t[3]) && t[4] == ' ')
        return 1;
    if (n > 4 && is_word(t[0]) && is_word(t[1]) && is_word(t[2]) && t[3] == ' ') return 1;
    return 0;
}

/* deepspeed._LOGGER after its timestamp: `\[[A-Z]{1,10}\] \[[^\]:\n]{1,120}:\d{1,7}:
 * [^\]\n]{1,120}\] ?`; the end, or -1 */
static Py_ssize_t logger_header(const uint8_t *t, Py_ssize_t n, Py_ssize_t p) {
    if (!(p < n && t[p] == '[')) return -1;
    Py_ssize_t q = p + 1;
    while (q < n && t[q] >= 'A' && t[q] <= 'Z' && q - p - 1 < 11) q++;
    if (q - p - 1 < 1 || q - p - 1 > 10 || !starts(t, n, q, "] [", 0)) return -1;
    q += 3;
    /* `[^\]:\n]{1,120}:\d{1,7}:` then `[^\]\n]{1,120}\]`: the file ends at its first ':' (no
     * ':' in it); the function runs to the first ']' */
    Py_ssize_t s = q;
    while (q < n && t[q] != ']' && t[q] != ':' && t[q] != '\n' && q - s < 121) q++;
    if (q - s < 1 || q - s > 120 || !(q < n && t[q] == ':')) return -1;
    int64_t ignored;
    int k = run_digits(t, n, q + 1, 7, &ignored);
    if (k == 0 || !(q + 1 + k < n && t[q + 1 + k] == ':')) return -1;
    q += 2 + k;
    s = q;
    while (q < n && t[q] != ']' && t[q] != '\n' && q - s < 121) q++;
    if (q - s < 1 || q - s > 120 || !(q < n && t[q] == ']')) return -1;
    q++;
    return q + (q < n && t[q] == ' ');
}

/* The message of the line at c (after its prefix, its newline off) as LogReader._handle_rest
 * finds it: after a DeepSpeed logger record's header and "[Rank N] " tag (the record's time in
 * f->ts, its rank in *rank, -1 none), else the whole text.  -1: the per-line path must say (a
 * time of another form leads the line, or a record's time is no date). */
static Py_ssize_t message_of(const uint8_t *t, Py_ssize_t n, Fields *f, int64_t *rank) {
    *rank = -1;
    if (n > 0 && t[0] == '[') {
        Cur stamp = {t, t + n};
        if (timestamp(&stamp, &f->ts, &f->valid)) {
            Py_ssize_t m = logger_header(t, n, stamp.p - t);
            if (!f->valid || m < 0) return -1;
            if (starts(t, n, m, "[Rank ", 0)) { /* _RANK_TAG: `\[Rank (-?\d{1,6})\] ` */
                Py_ssize_t q = m + 6;
                int negative = q < n && t[q] == '-';
                int64_t value;
                int k = run_digits(t, n, q + negative, 6, &value);
                if (k > 0 && starts(t, n, q + negative + k, "] ", 0)) {
                    *rank = negative && value ? -1 : value;
                    m = q + negative + k + 2;
                }
            }
            return m;
        }
    }
    return maybe_time(t, n) ? -1 : 0;
}

/* `\s{1,most}` */
static inline int gap(Cur *c, int most) {
    int k = 0;
    while (c->p < c->e && is_space(*c->p)) c->p++, k++;
    return k >= 1 && k <= most;
}

/* deepspeed._MEMORY at c: `MA (N) GB\s{1,40}Max_MA (N) GB\s{1,40}CA (N) GB\s{1,40}Max_CA (N) GB` */
static int memory_at(Cur *c, Fields *f) {
    double a, b, cc, d;
    if (!(lit_n(c, "MA ", 3) && decimal(c, 9, 6, &a) && lit_n(c, " GB", 3) && gap(c, 40) &&
          lit_n(c, "Max_MA ", 7) && decimal(c, 9, 6, &b) && lit_n(c, " GB", 3) && gap(c, 40) &&
          lit_n(c, "CA ", 3) && decimal(c, 9, 6, &cc) && lit_n(c, " GB", 3) && gap(c, 40) &&
          lit_n(c, "Max_CA ", 7) && decimal(c, 9, 6, &d) && lit_n(c, " GB", 3)))
        return 0;
    f->a = gib(a);
    f->b = gib(b);
    f->c = gib(cc);
    f->d = gib(d);
    return 1;
}

/* deepspeed._CPU at c: `CPU Virtual Memory:\s{1,10}used = (N) GB, percent = (\d{1,3}(\.\d{1,6})?)%` */
static int cpu_at(Cur *c, Fields *f) {
    double used, percent;
    if (!(lit_n(c, "CPU Virtual Memory:", 19) && gap(c, 10) && lit_n(c, "used = ", 7) &&
          decimal(c, 9, 6, &used) && lit_n(c, " GB, percent = ", 15) &&
          decimal(c, 3, 6, &percent) && lit_n(c, "%", 1)))
        return 0;
    f->a = gib(used);
    f->f = percent;
    return 1;
}

/* The first match in t[0:n] of a pattern that opens with lit, tried at each occurrence */
static int search_at(const uint8_t *t, Py_ssize_t n, const char *lit, int (*at)(Cur *, Fields *),
                     Fields *f) {
    for (Py_ssize_t k = find(t, n, 0, lit); k >= 0; k = find(t, n, k + 1, lit)) {
        Cur c = {t + k, t + n};
        if (at(&c, f)) return 1;
    }
    return 0;
}

/* deepspeed._CACHE_FLUSH: `(\d{1,12}) pytorch allocator cache flushes since last step` */
static int flush_search(const uint8_t *t, Py_ssize_t n, Fields *f) {
    static const char LIT[] = " pytorch allocator cache flushes since last step";
    for (Py_ssize_t k = find(t, n, 0, LIT); k >= 0; k = find(t, n, k + 1, LIT)) {
        Py_ssize_t s = k;
        while (s > 0 && DIGIT[t[s - 1]] && k - s < 12) s--;
        if (s == k) continue;
        int64_t value;
        run_digits(t, n, s, 12, &value);
        f->a = value;
        return 1;
    }
    return 0;
}

/* A line of bulk kind `kind` at c (after its prefix) read as its matcher reads its message:
 * true with its fields in f, false for the per-line path (a record's own rank: the reader's
 * series are kept per prefix rank here). */
static int match_shape(int kind, Cur *c, Fields *f) {
    const uint8_t *t = c->p;
    Py_ssize_t n = c->e - c->p, m;
    if (n > 0 && t[n - 1] == '\n') n--;
    int64_t rank;
    if ((m = message_of(t, n, f, &rank)) < 0 || rank >= 0) return 0;
    switch (kind) {
        case MEMORY:
            return search_at(t + m, n - m, "MA ", memory_at, f);
        case CPU:
            return search_at(t + m, n - m, "CPU Virtual Memory:", cpu_at, f);
        case FLUSH_LINE:
            return flush_search(t + m, n - m, f);
    }
    return 0;
}

/* A progress line (bits.STEP only) at c, after its prefix: P_READ with its fields (ts, the
 * record's or the text's rank in c, the form in d), else P_UNSURE. */
static int progress_line(Cur *c, Fields *f) {
    const uint8_t *t = c->p;
    Py_ssize_t n = c->e - c->p, m;
    if (n > 0 && t[n - 1] == '\n') n--;
    int64_t record_rank;
    if ((m = message_of(t, n, f, &record_rank)) < 0) return P_UNSURE;
    const uint8_t *msg = t + m;
    Py_ssize_t len = n - m;
    static const char *COMPLETION[] = {"inished", "exits successfully", "train_runtime", "stopped",
                                       "ompleted"};
    for (int j = 0; j < 5; j++)
        if (has(msg, len, COMPLETION[j])) return P_UNSURE;
    f->d = FORM_NONE;
    f->c = -1;
    if (parse_progress(msg, len, f) < 0) return P_UNSURE;
    if (record_rank >= 0) f->c = record_rank;
    return P_READ;
}

#endif
