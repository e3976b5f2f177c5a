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
 * - Accumulator (_encode_accumulate.h): records appended to per-partition open batches as input
 *   batches come, as Kafka's RecordAccumulator does (accumulate.BatchAccumulator).
 * Offsets and validity bitmaps come from objects we do not own, so every span is checked
 * against its buffer. The two-pass function writes a record only where it still takes exactly
 * the space pass 1 gave it: a caller's thread changing a numpy array while the GIL is released
 * gets an error, never a write out of bounds. The accumulator holds the GIL throughout and
 * refuses to be re-entered from its allocate.
 *
 * Also in this module: Kafka's murmur2 partitioner over a binary array (_encode_murmur2.h), the
 * C twin of arrow_encode.py:murmur2_array / partitions_for_keys (same rules: optional, numpy
 * reference). The shared input and record code is _encode_common.h.
 *
 * And the log cleaner's hot loops (_encode_cleaner.h): key digests, the offset map's table, the
 * kept records of a batch (log/offset_map.py, log/cleaner.py are their reference).
 */
#include "_encode_common.h"
#include "_encode_accumulate.h"
#include "_encode_murmur2.h"
#include "_encode_cleaner.h"

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
    OpenInput cols;
    memset(&cols, 0, sizeof(cols));
    Input *in = &cols.in;
    int have_offs = 0, have_data = 0;
    PyObject *offs_obj = NULL, *data_obj = NULL, *result = NULL;
    Py_buffer offs_view, data_view;
    int64_t *bounds = NULL;

    Py_ssize_t n = PyObject_Length(value);
    if (n < 0)
        return NULL;
    if (input_open(&cols, key, value, ts_obj, hrec_obj, hcount_obj, n) < 0)
        goto done;
    bounds = copy_bounds(bounds_obj, n, &in->nbounds);
    if (bounds == NULL)
        goto done;
    in->bounds = bounds;
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
    rc = size_records(in, offs);
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
    rc = fill_records(in, offs, out);
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
    input_close(&cols);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_v2_records", encode_v2_records, METH_VARARGS, encode_v2_records_doc},
    {"murmur2_hashes", murmur2_hashes, METH_VARARGS, murmur2_hashes_doc},
    {"murmur2_partitions", murmur2_partitions, METH_VARARGS, murmur2_partitions_doc},
    {"key_digests", key_digests, METH_VARARGS, key_digests_doc},
    {"offset_map_put", offset_map_put, METH_VARARGS, offset_map_put_doc},
    {"offset_map_get", offset_map_get, METH_VARARGS, offset_map_get_doc},
    {"filter_v2_records", filter_v2_records, METH_VARARGS, filter_v2_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_encode_accel",
    "C twins of pyspark_kafkalog.arrow.arrow_encode's numpy kernels: the records section built\n"
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
