/* The reader's apply of a run (bulk_apply._close_order): the order in which a run's memory
 * samples close, in one pass over its hits in line order, where numpy needed a stable sort by
 * stream, a sort by closing place and a dozen passes (a tenth of a dense log's apply).
 *
 * A stream's open sample closes at the stream's next line the reader visits (a hit not
 * consumed), with that line's CPU values when it is a CPU line; a memory line whose next hit
 * is consumed (its CPU line, read ahead with it) closes at once, just after the sample its
 * own line closed.  Visiting the hits in line order meets the samples in closing order. */

/* close_order(kind, consumed, stream, open_before): kind (int8), consumed (bool) and stream
 * (int64, 0 <= stream < len(open_before)) per hit; open_before (int8) per stream: 1 when the
 * reader had a sample open on it before the run.  Returns (line, cpu, state) as int64
 * bytearrays: per closed sample in closing order, the hit it was printed on (-1 - s: stream
 * s's sample from before the run) and the hit of its CPU values (-1: none); per stream, what
 * is open after the run: the hit of its open sample, -1 for none, -2 for the sample from
 * before the run (the stream had no visited line). */
static PyObject *close_order(PyObject *self, PyObject *args) {
    Py_buffer kv, cv, sv, ov;
    if (!PyArg_ParseTuple(args, "y*y*y*y*", &kv, &cv, &sv, &ov)) return NULL;
    PyObject *result = NULL, *line_out = NULL, *cpu_out = NULL, *state_out = NULL;
    const int8_t *kind = kv.buf, *open_before = ov.buf;
    const uint8_t *consumed = cv.buf;
    const int64_t *stream = sv.buf;
    Py_ssize_t n = kv.len, streams = ov.len;
    const char *problem = NULL;
    if (cv.len != n || sv.len != n * (Py_ssize_t)sizeof(int64_t))
        problem = "one consumed flag and one stream per hit";
    for (Py_ssize_t i = 0; i < n && !problem; i++)
        if (stream[i] < 0 || stream[i] >= streams) problem = "streams from 0 below len(open_before)";
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        goto done;
    }
    /* at most one closed sample per hit, plus one per stream from before the run */
    line_out = PyByteArray_FromStringAndSize(NULL, (n + streams) * (Py_ssize_t)sizeof(int64_t));
    cpu_out = PyByteArray_FromStringAndSize(NULL, (n + streams) * (Py_ssize_t)sizeof(int64_t));
    state_out = PyByteArray_FromStringAndSize(NULL, streams * (Py_ssize_t)sizeof(int64_t));
    if (line_out == NULL || cpu_out == NULL || state_out == NULL) goto done;
    int64_t *line = (int64_t *)PyByteArray_AS_STRING(line_out);
    int64_t *cpu = (int64_t *)PyByteArray_AS_STRING(cpu_out);
    int64_t *state = (int64_t *)PyByteArray_AS_STRING(state_out);
    for (Py_ssize_t s = 0; s < streams; s++) state[s] = open_before[s] ? -2 : -1;
    Py_ssize_t closed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (consumed[i]) continue;
        int64_t s = stream[i], open = state[s];
        if (open != -1) { /* the stream's next visited line closes its open sample */
            line[closed] = open == -2 ? -1 - s : open;
            cpu[closed++] = kind[i] == CPU ? i : -1;
            state[s] = -1;
        }
        if (kind[i] != MEMORY) continue;
        if (i + 1 < n && consumed[i + 1]) { /* read with its CPU line: closes at once */
            line[closed] = i;
            cpu[closed++] = i + 1;
        } else {
            state[s] = i;
        }
    }
    if (PyByteArray_Resize(line_out, closed * (Py_ssize_t)sizeof(int64_t)) < 0 ||
        PyByteArray_Resize(cpu_out, closed * (Py_ssize_t)sizeof(int64_t)) < 0)
        goto done;
    result = PyTuple_Pack(3, line_out, cpu_out, state_out);
done:
    Py_XDECREF(line_out);
    Py_XDECREF(cpu_out);
    Py_XDECREF(state_out);
    PyBuffer_Release(&kv);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&ov);
    return result;
}

/* first_seen(values): for int64 values, the position of each distinct value's first
 * occurrence, in the order they first occur, and each value's group (the index of its value
 * among those firsts), as int64 bytearrays: numpy's unique sorts, and the apply groups a
 * run's lines by stream, rank and label a dozen times (runs of equal values skip the hash). */
static PyObject *first_seen(PyObject *self, PyObject *args) {
    Py_buffer vv;
    if (!PyArg_ParseTuple(args, "y*", &vv)) return NULL;
    PyObject *result = NULL, *firsts_out = NULL, *group_out = NULL;
    const int64_t *values = vv.buf;
    Py_ssize_t n = vv.len / (Py_ssize_t)sizeof(int64_t), size = 16, used = 0;
    int64_t *table = NULL, *firsts = NULL;
    if (vv.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "int64 values");
        goto done;
    }
    group_out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (group_out == NULL) goto done;
    int64_t *group = (int64_t *)PyByteArray_AS_STRING(group_out);
    table = malloc(size * sizeof(int64_t)); /* slot: first position of its value, -1 free */
    firsts = malloc((size / 2) * sizeof(int64_t));
    if (table == NULL || firsts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < size; j++) table[j] = -1;
    int64_t last_group = -1, low = 0, high = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 0 || values[i] < low) low = values[i];
        if (i == 0 || values[i] > high) high = values[i];
    }
    if (n > 0 && (uint64_t)high - (uint64_t)low < (1u << 16)) {
        /* ranks, streams, keepers: a few values in a small range, each its own slot */
        int32_t *slot_of = malloc(((uint64_t)high - (uint64_t)low + 1) * sizeof(int32_t));
        int64_t *more = realloc(firsts, ((uint64_t)high - (uint64_t)low + 1) * sizeof(int64_t));
        if (more) firsts = more;
        if (slot_of == NULL || more == NULL) {
            free(slot_of);
            PyErr_NoMemory();
            goto done;
        }
        for (uint64_t j = 0; j <= (uint64_t)high - (uint64_t)low; j++) slot_of[j] = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t *g = &slot_of[(uint64_t)values[i] - (uint64_t)low];
            if (*g < 0) {
                firsts[used] = i;
                *g = (int32_t)used++;
            }
            group[i] = *g;
        }
        free(slot_of);
        n = 0; /* done: skip the hashed pass */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = values[i];
        if (last_group >= 0 && values[firsts[last_group]] == v) {
            group[i] = last_group;
            continue;
        }
        uint64_t h = (uint64_t)v * 0x9E3779B97F4A7C15ULL;
        Py_ssize_t slot = (Py_ssize_t)(h >> 32) & (size - 1);
        while (table[slot] >= 0 && values[firsts[table[slot]]] != v) slot = (slot + 1) & (size - 1);
        if (table[slot] < 0) {
            if (2 * (used + 1) > size) { /* grow, place the groups again, then find the slot */
                Py_ssize_t bigger = 2 * size;
                int64_t *more_table = malloc(bigger * sizeof(int64_t));
                int64_t *more_firsts = realloc(firsts, (bigger / 2) * sizeof(int64_t));
                if (more_firsts) firsts = more_firsts;
                if (more_table == NULL || more_firsts == NULL) {
                    free(more_table);
                    PyErr_NoMemory();
                    goto done;
                }
                free(table);
                table = more_table;
                size = bigger;
                for (Py_ssize_t j = 0; j < size; j++) table[j] = -1;
                for (Py_ssize_t g = 0; g < used; g++) {
                    uint64_t hg = (uint64_t)values[firsts[g]] * 0x9E3779B97F4A7C15ULL;
                    Py_ssize_t at = (Py_ssize_t)(hg >> 32) & (size - 1);
                    while (table[at] >= 0) at = (at + 1) & (size - 1);
                    table[at] = g;
                }
                slot = (Py_ssize_t)(h >> 32) & (size - 1);
                while (table[slot] >= 0) slot = (slot + 1) & (size - 1);
            }
            firsts[used] = i;
            table[slot] = used++;
        }
        group[i] = last_group = table[slot];
    }
    firsts_out = PyByteArray_FromStringAndSize((const char *)firsts, used * (Py_ssize_t)sizeof(int64_t));
    if (firsts_out != NULL) result = PyTuple_Pack(2, firsts_out, group_out);
done:
    Py_XDECREF(firsts_out);
    Py_XDECREF(group_out);
    free(table);
    free(firsts);
    PyBuffer_Release(&vv);
    return result;
}
