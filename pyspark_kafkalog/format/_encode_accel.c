/*
 * C twins of the numpy kernels of pyspark_kafkalog/format/arrow_encode.py, and the sink's
 * accumulator (format/accumulate.py): the write path of the Spark sink.
 *
 * Optional: the Python modules keep their numpy/Arrow code and use it when this module is
 * missing or KAFKALOG_PURE_PYTHON=1, so both must give the same bytes for every input they take;
 * the numpy code and encode.encode_batch_v2 are the reference. The Python side only calls in
 * here with inputs the numpy code would encode (binary arrays of the right lengths, valid
 * bounds), so the errors raised here for other inputs need not match it: they only keep memory
 * safe.
 *
 * - encode_v2_records: the records section of encode_v2_chunks, in two passes without the GIL:
 *   pass 1 sizes every record, so the output is allocated once at its exact size from the
 *   caller's allocator (Arrow's pool, which reuses memory: fresh pages from malloc each cost a
 *   page fault on first write); pass 2 fills it.
 * - encode_v2_gather: the same for rows gathered from several input batches by row number
 *   (arrow_encode.encode_v2_pieces), each batch behind room for its header.
 * - Accumulator (_encode_accumulate.h): records appended to per-partition open batches as input
 *   batches come, as Kafka's RecordAccumulator does (accumulate.BatchAccumulator).
 * Offsets and validity bitmaps come from objects we do not own, so every span is checked
 * against its buffer. The two-pass functions write a record only where it still takes exactly
 * the space pass 1 gave it: a caller's thread changing a numpy array while the GIL is released
 * gets an error, never a write out of bounds. The accumulator holds the GIL throughout and
 * refuses to be re-entered from its allocate.
 *
 * Also in this module: Kafka's murmur2 partitioner over a binary array (_encode_murmur2.h), the
 * C twin of arrow_encode.py:murmur2_array / partitions_for_keys (same rules: optional, numpy
 * reference). The shared input and record code is _encode_common.h.
 */
#include "_encode_common.h"
#include "_encode_accumulate.h"
#include "_encode_murmur2.h"

PyDoc_STRVAR(encode_v2_records_doc,
"encode_v2_records(key, value, timestamps, bounds, hrec, hcount, allocate)\n--\n\n"
"The records section of the magic 2 batches ``[bounds[i], bounds[i+1])``, back to back.\n\n"
"``key``/``value``: pyarrow binary arrays (null = Kafka's null; slices are fine), all of\n"
"``len(value)`` rows; ``timestamps``: int64 ms per row (deltas are taken from each batch's\n"
"first row); ``bounds``: int64, 0 up to the row count, non-decreasing; ``hrec``: each row's\n"
"encoded headers as a binary array, or None; ``hcount``: int64 header count per row, or None\n"
"for all zero; ``allocate(size)``: a writable buffer of at least ``size`` bytes\n"
"(``pyarrow.allocate_buffer``).\n\n"
"Returns ``(offsets, data)``, both from ``allocate``: ``n + 1`` int64 offsets where record\n"
"``i`` spans ``data[offsets[i]:offsets[i+1]]``, and the records, byte for byte what\n"
"``encode.encode_batch_v2`` writes after its header. Raises InvalidRecordError when the\n"
"records reach 2**31 bytes.");

static PyObject *
encode_v2_records(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *key, *value, *ts_obj, *bounds_obj, *hrec_obj, *hcount_obj, *allocate;
    if (!PyArg_ParseTuple(args, "OOOOOOO:encode_v2_records", &key, &value, &ts_obj, &bounds_obj,
                          &hrec_obj, &hcount_obj, &allocate))
        return NULL;
    Input in;
    memset(&in, 0, sizeof(in));
    Py_buffer ts_view, hc_view;
    int have_ts = 0, have_hc = 0, have_offs = 0, have_data = 0;
    PyObject *offs_obj = NULL, *data_obj = NULL, *result = NULL;
    Py_buffer offs_view, data_view;
    int64_t *bounds = NULL;

    Py_ssize_t n = PyObject_Length(value);
    if (n < 0)
        return NULL;
    if (binary_open(key, "key", n, &in.key) < 0 || binary_open(value, "value", n, &in.value) < 0)
        goto done;
    if (hrec_obj != Py_None) {
        if (binary_open(hrec_obj, "hrec", n, &in.hrec) < 0)
            goto done;
        in.with_hrec = 1;
    }
    if (int64_open(ts_obj, "timestamps", n, &ts_view) < 0)
        goto done;
    have_ts = 1;
    in.ts = (const uint8_t *)ts_view.buf;
    if (hcount_obj != Py_None) {
        if (int64_open(hcount_obj, "hcount", n, &hc_view) < 0)
            goto done;
        have_hc = 1;
        in.hcount = (const uint8_t *)hc_view.buf;
    }
    bounds = copy_bounds(bounds_obj, n, &in.nbounds);
    if (bounds == NULL)
        goto done;
    in.bounds = bounds;
    if (n > PY_SSIZE_T_MAX / 8 - 1) {
        PyErr_NoMemory();
        goto done;
    }

    uint8_t *offs = take_buffer(allocate, (n + 1) * 8, &offs_obj, &offs_view);
    if (offs == NULL)
        goto done;
    have_offs = 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = size_records(&in, offs);
    Py_END_ALLOW_THREADS
    if (rc != E_OK) {
        raise_failure(rc);
        goto done;
    }
    Py_ssize_t total = (Py_ssize_t)ld64(offs + 8 * n);
    uint8_t *out = take_buffer(allocate, total, &data_obj, &data_view);
    if (out == NULL)
        goto done;
    have_data = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = fill_records(&in, offs, out);
    Py_END_ALLOW_THREADS
    if (rc != E_OK) {
        raise_failure(rc);
        goto done;
    }
    result = PyTuple_Pack(2, offs_obj, data_obj);
done:
    if (have_data)
        PyBuffer_Release(&data_view);
    if (have_offs)
        PyBuffer_Release(&offs_view);
    Py_XDECREF(data_obj);
    Py_XDECREF(offs_obj);
    free(bounds);
    if (have_hc)
        PyBuffer_Release(&hc_view);
    if (have_ts)
        PyBuffer_Release(&ts_view);
    binary_close(&in.hrec);
    binary_close(&in.value);
    binary_close(&in.key);
    return result;
}

/* -- records gathered from several inputs ---------------------------------------------------- */

/* The sink buffers each Kafka partition's rows as pieces: (an input batch, the numbers of its
 * rows that go to the partition). Encoding them straight from the inputs spares the copies a
 * take() and a concatenation would make of every key and value; each batch's records land
 * behind `room` free bytes, where the caller writes the batch header, so the CRC can run in
 * place and the batch is never copied again. */
typedef struct {
    Input in;                 /* its bounds are unused */
    Py_buffer ts_view, hc_view, rows_view;
    int have_ts, have_hc, have_rows;
    const uint8_t *rows;      /* int64 row numbers into the arrays; NULL: 0..n_in-1 */
    Py_ssize_t n_rows;        /* records this piece gives */
    Py_ssize_t n_in;          /* rows of its arrays */
} Piece;

static void
piece_close(Piece *pc)
{
    if (pc->have_rows)
        PyBuffer_Release(&pc->rows_view);
    if (pc->have_hc)
        PyBuffer_Release(&pc->hc_view);
    if (pc->have_ts)
        PyBuffer_Release(&pc->ts_view);
    binary_close(&pc->in.hrec);
    binary_close(&pc->in.value);
    binary_close(&pc->in.key);
}

/* (key, value, timestamps, hrec, hcount, rows): as for encode_v2_records, rows None or int64 */
static int
piece_open(PyObject *item, Piece *pc)
{
    memset(pc, 0, sizeof(*pc));
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "a piece is a tuple (key, value, timestamps, hrec, hcount, rows)");
        return -1;
    }
    PyObject *value = PyTuple_GET_ITEM(item, 1), *hrec = PyTuple_GET_ITEM(item, 3);
    PyObject *hcount = PyTuple_GET_ITEM(item, 4), *rows = PyTuple_GET_ITEM(item, 5);
    Py_ssize_t n = PyObject_Length(value);
    if (n < 0)
        return -1;
    pc->n_in = pc->n_rows = n;
    if (binary_open(PyTuple_GET_ITEM(item, 0), "key", n, &pc->in.key) < 0 ||
        binary_open(value, "value", n, &pc->in.value) < 0)
        return -1;
    if (hrec != Py_None) {
        if (binary_open(hrec, "hrec", n, &pc->in.hrec) < 0)
            return -1;
        pc->in.with_hrec = 1;
    }
    if (int64_open(PyTuple_GET_ITEM(item, 2), "timestamps", n, &pc->ts_view) < 0)
        return -1;
    pc->have_ts = 1;
    pc->in.ts = (const uint8_t *)pc->ts_view.buf;
    if (hcount != Py_None) {
        if (int64_open(hcount, "hcount", n, &pc->hc_view) < 0)
            return -1;
        pc->have_hc = 1;
        pc->in.hcount = (const uint8_t *)pc->hc_view.buf;
    }
    if (rows != Py_None) {
        if (int64_open(rows, "rows", -1, &pc->rows_view) < 0)
            return -1;
        pc->have_rows = 1;
        pc->rows = (const uint8_t *)pc->rows_view.buf;
        pc->n_rows = pc->rows_view.len / 8;
    }
    return 0;
}

/* Where the walk over the concatenated rows of all pieces stands. */
typedef struct {
    const Piece *pcs;
    Py_ssize_t npcs, pi, j;
} Cursor;

static inline void
cursor_skip_empty(Cursor *c)
{
    while (c->pi < c->npcs && c->j >= c->pcs[c->pi].n_rows) {
        c->pi++;
        c->j = 0;
    }
}

/* The current record's piece and row (checked against the piece's arrays: a caller may change
 * a numpy array of row numbers while the GIL is released, between the two passes). */
static inline int
cursor_row(const Cursor *c, const Piece **pc, Py_ssize_t *row)
{
    if (c->pi >= c->npcs)
        return E_ROW;
    *pc = &c->pcs[c->pi];
    int64_t r = (*pc)->rows != NULL ? ld64((*pc)->rows + 8 * c->j) : (int64_t)c->j;
    if (r < 0 || r >= (*pc)->n_in)
        return E_ROW;
    *row = (Py_ssize_t)r;
    return E_OK;
}

/* One pass over the batches [bounds[b], bounds[b+1]) of the concatenated rows. Pass 1 (out ==
 * NULL) fills info[b] = (start, end, base timestamp, max timestamp): batch b takes
 * out[start:end], its records from start + room. Pass 2 writes the records, each only if it
 * still fits the space pass 1 gave the batch, which it must fill exactly. */
static int
gather_pass(const Piece *pcs, Py_ssize_t npcs, const int64_t *bounds, Py_ssize_t nbounds,
            int64_t room, uint8_t *info, uint8_t *out)
{
    Cursor c = {pcs, npcs, 0, 0};
    int64_t total = 0;
    Fields f;
    for (Py_ssize_t b = 0; b + 1 < nbounds; b++) {
        int64_t count = bounds[b + 1] - bounds[b];
        const Piece *pc;
        Py_ssize_t row;
        cursor_skip_empty(&c);
        int rc = cursor_row(&c, &pc, &row);
        if (rc != E_OK)
            return rc;
        int64_t base_ts = ld64(pc->in.ts + 8 * row), max_ts = base_ts;
        uint8_t *slot = info + 32 * b;
        int64_t start = out == NULL ? total : ld64(slot), end = out == NULL ? 0 : ld64(slot + 8);
        int64_t at = start + room;
        for (int64_t k = 0; k < count; k++) {
            cursor_skip_empty(&c);
            if ((rc = cursor_row(&c, &pc, &row)) != E_OK ||
                (rc = fields_at(&pc->in, row, base_ts, k, &f)) != E_OK)
                return rc;
            int64_t ts = ld64(pc->in.ts + 8 * row);
            if (ts > max_ts)
                max_ts = ts;
            if (out != NULL) {
                if (f.size > end - at)
                    return E_CHANGED;
                put_record(out + at, &pc->in, &f);
            }
            at += f.size;
            if (at >= MAX_TOTAL)
                return E_TOO_MANY;
            c.j++;
        }
        if (out == NULL) {
            st64(slot, start);
            st64(slot + 8, at);
            st64(slot + 16, base_ts);
            st64(slot + 24, max_ts);
            total = at;
        } else if (at != end) {
            return E_CHANGED;
        }
    }
    return E_OK;
}

PyDoc_STRVAR(encode_v2_gather_doc,
"encode_v2_gather(pieces, bounds, room, allocate)\n--\n\n"
"The magic 2 batches ``[bounds[i], bounds[i+1])`` of the rows that ``pieces`` give in order,\n"
"each behind ``room`` free bytes for its header.\n\n"
"``pieces``: a sequence of ``(key, value, timestamps, hrec, hcount, rows)``: the first five as\n"
"for ``encode_v2_records`` (all of the piece's input rows), ``rows`` the int64 numbers of the\n"
"rows it gives, in order, or None for all of them. ``bounds``: int64, rising strictly from 0\n"
"to the number of rows given. ``allocate`` as for ``encode_v2_records``.\n\n"
"Returns ``(info, data)``, both from ``allocate``: ``info`` holds four int64 per batch,\n"
"``(start, end, base_timestamp, max_timestamp)``; batch ``i`` takes ``data[start:end]``, and\n"
"its records, byte for byte what ``encode.encode_batch_v2`` writes after its header, start at\n"
"``start + room``. Raises InvalidRecordError when the data reaches 2**31 bytes.");

static PyObject *
encode_v2_gather(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *pieces_obj, *bounds_obj, *allocate;
    Py_ssize_t room;
    if (!PyArg_ParseTuple(args, "OOnO:encode_v2_gather", &pieces_obj, &bounds_obj, &room,
                          &allocate))
        return NULL;
    if (room < 0 || room > 4096) {
        PyErr_Format(PyExc_ValueError, "room must be 0..4096, not %zd", room);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(pieces_obj, "pieces must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t npcs = PySequence_Fast_GET_SIZE(seq), opened = 0, nbounds = 0;
    Piece *pcs = (Piece *)calloc(npcs > 0 ? (size_t)npcs : 1, sizeof(Piece));
    PyObject *info_obj = NULL, *data_obj = NULL, *result = NULL;
    Py_buffer info_view, data_view;
    int have_info = 0, have_data = 0, rc;
    int64_t *bounds = NULL, rows = 0;
    if (pcs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; opened < npcs; opened++) {
        if (piece_open(PySequence_Fast_GET_ITEM(seq, opened), &pcs[opened]) < 0) {
            opened++;   /* close what it opened */
            goto done;
        }
        rows += pcs[opened].n_rows;
    }
    bounds = copy_bounds(bounds_obj, (Py_ssize_t)rows, &nbounds);
    if (bounds == NULL)
        goto done;
    for (Py_ssize_t b = 0; b + 1 < nbounds; b++)
        if (bounds[b + 1] == bounds[b]) {
            PyErr_SetString(PyExc_ValueError, "bounds must rise strictly: a batch has records");
            goto done;
        }
    uint8_t *info = take_buffer(allocate, (nbounds - 1) * 32, &info_obj, &info_view);
    if (info == NULL)
        goto done;
    have_info = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = gather_pass(pcs, npcs, bounds, nbounds, room, info, NULL);
    Py_END_ALLOW_THREADS
    if (rc != E_OK) {
        raise_failure(rc);
        goto done;
    }
    Py_ssize_t total = nbounds > 1 ? (Py_ssize_t)ld64(info + 32 * (nbounds - 2) + 8) : 0;
    uint8_t *out = take_buffer(allocate, total, &data_obj, &data_view);
    if (out == NULL)
        goto done;
    have_data = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = gather_pass(pcs, npcs, bounds, nbounds, room, info, out);
    Py_END_ALLOW_THREADS
    if (rc != E_OK) {
        raise_failure(rc);
        goto done;
    }
    result = PyTuple_Pack(2, info_obj, data_obj);
done:
    if (have_data)
        PyBuffer_Release(&data_view);
    if (have_info)
        PyBuffer_Release(&info_view);
    Py_XDECREF(data_obj);
    Py_XDECREF(info_obj);
    free(bounds);
    for (Py_ssize_t i = 0; i < opened && pcs != NULL; i++)
        piece_close(&pcs[i]);
    free(pcs);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_v2_records", encode_v2_records, METH_VARARGS, encode_v2_records_doc},
    {"encode_v2_gather", encode_v2_gather, METH_VARARGS, encode_v2_gather_doc},
    {"murmur2_hashes", murmur2_hashes, METH_VARARGS, murmur2_hashes_doc},
    {"murmur2_partitions", murmur2_partitions, METH_VARARGS, murmur2_partitions_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_encode_accel",
    "C twins of pyspark_kafkalog.format.arrow_encode's numpy kernels: the records section built\n"
    "by encode_v2_chunks, and Kafka's murmur2 partitioner (murmur2_array, partitions_for_keys).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__encode_accel(void)
{
    PyObject *errors = PyImport_ImportModule("pyspark_kafkalog.errors");
    if (errors == NULL)
        return NULL;
    InvalidRecordError = PyObject_GetAttrString(errors, "InvalidRecordError");
    Py_DECREF(errors);
    if (InvalidRecordError == NULL)
        return NULL;
    if (PyType_Ready(&AccumulatorType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AccumulatorType);
    if (PyModule_AddObject(m, "Accumulator", (PyObject *)&AccumulatorType) < 0) {
        Py_DECREF(&AccumulatorType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
