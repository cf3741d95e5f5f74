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
