/*
 * C twin of pyspark_kafkalog/format/_columnar_py.py:scan_v2, the magic 2 record loop.
 *
 * Optional: columnar.py falls back to the Python loop when this module is missing, so both must
 * give the same columns and raise CorruptRecordError with the same message at the same point for
 * every input. The Python module's docstring lists the rules; this file follows them step by
 * step, including reads that run past a record's own end (only the blob's end is a hard stop).
 *
 * Every length and count comes from untrusted bytes. Pass 1 parses and validates into scratch
 * arrays without the GIL and without touching Python objects; only a batch that parsed whole is
 * appended to the Columns (pass 2), so a corrupt batch leaves them as they were.
 */
#include "_columnar_parse.h"

static PyObject *CorruptRecordError;   /* pyspark_kafkalog.errors.CorruptRecordError */
PyObject *kafkalog_KafkaLogError;      /* pyspark_kafkalog.errors.KafkaLogError (shared) */
static PyObject *s_frombytes;          /* interned method name */

/* _columnar_arrow.c */
extern PyObject *kafkalog_scan_run_arrow(PyObject *self, PyObject *args);
extern const char kafkalog_scan_run_arrow_doc[];

/* -- pass 2: append ------------------------------------------------------------------------ */

static int
append_array(PyObject *arr, const void *data, Py_ssize_t size)
{
    if (size == 0)
        return 0;
    PyObject *view = PyMemoryView_FromMemory((char *)data, size, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *res = PyObject_CallMethodObjArgs(arr, s_frombytes, view, NULL);
    Py_DECREF(view);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

static int
extend_bytearray(PyObject *ba, Py_ssize_t extra, char **out)
{
    if (!PyByteArray_Check(ba)) {
        PyErr_SetString(PyExc_TypeError, "Columns data and validity buffers must be bytearrays");
        return -1;
    }
    Py_ssize_t n0 = PyByteArray_GET_SIZE(ba);
    if (extra > PY_SSIZE_T_MAX - n0) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = n0 + extra;
    /* bytearray grows by 1/8 at a time, each time a realloc that may copy everything so far;
     * double instead: grow to twice the size, then shrink to the size wanted, which CPython
     * does in place (a shrink to at least half the allocation keeps it). */
    if (need >= ((PyByteArrayObject *)ba)->ob_alloc && n0 > 0 && n0 < PY_SSIZE_T_MAX / 2 &&
        need < 2 * n0) {
        if (PyByteArray_Resize(ba, 2 * n0) < 0)
            return -1;
    }
    if (PyByteArray_Resize(ba, need) < 0)
        return -1;
    *out = PyByteArray_AS_STRING(ba) + n0;
    return 0;
}

/* Append n spans (start, len; len -1 = null) of blob to data/offsets[/valid]. */
static int
append_spans(const uint8_t *blob, Py_ssize_t n, const int64_t *start, const int64_t *len,
             PyObject *data, PyObject *offsets, PyObject *valid)
{
    if (n == 0)
        return 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (len[i] > 0)
            total += (Py_ssize_t)len[i];
    if (!PyByteArray_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "Columns data buffers must be bytearrays");
        return -1;
    }
    Py_ssize_t base = PyByteArray_GET_SIZE(data);
    char *dst;
    if (extend_bytearray(data, total, &dst) < 0)
        return -1;
    int64_t *ends = (int64_t *)malloc((size_t)n * 8);
    if (ends == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t at = base;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (len[i] > 0) {
            memcpy(dst, blob + start[i], (size_t)len[i]);
            dst += len[i];
            at += len[i];
        }
        ends[i] = at;
    }
    int rc = append_array(offsets, ends, n * 8);
    free(ends);
    if (rc < 0)
        return -1;
    if (valid != NULL) {
        char *v;
        if (extend_bytearray(valid, n, &v) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            v[i] = len[i] >= 0;
    }
    return 0;
}

static const char *const FIELDS[] = {
    "offset", "timestamp", "timestamp_type", "header_count",
    "key_data", "key_offsets", "key_valid", "value_data", "value_offsets", "value_valid",
    "header_key_data", "header_key_offsets", "header_value_data", "header_value_offsets",
    "header_value_valid",
};
#define NFIELDS (sizeof(FIELDS) / sizeof(FIELDS[0]))
enum { F_OFFSET, F_TS, F_TS_TYPE, F_HCOUNT, F_KDATA, F_KOFFS, F_KVALID, F_VDATA, F_VOFFS,
       F_VVALID, F_HKDATA, F_HKOFFS, F_HVDATA, F_HVOFFS, F_HVVALID };

static int
commit(PyObject *cols, const uint8_t *blob, Rows *rows, Headers *hdrs, int ts_type)
{
    PyObject *f[NFIELDS] = {NULL};
    int rc = -1;
    Py_ssize_t n = rows->n;
    for (size_t i = 0; i < NFIELDS; i++) {
        f[i] = PyObject_GetAttrString(cols, FIELDS[i]);
        if (f[i] == NULL)
            goto done;
    }
    if (n == 0) {
        rc = 0;
        goto done;
    }
    char *types = (char *)malloc((size_t)n);
    if (types == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(types, (signed char)ts_type, (size_t)n);
    int bad = append_array(f[F_TS_TYPE], types, n);
    free(types);
    if (bad ||
        append_array(f[F_OFFSET], rows->offset, n * 8) < 0 ||
        append_array(f[F_TS], rows->timestamp, n * 8) < 0 ||
        append_array(f[F_HCOUNT], rows->hcount, n * 4) < 0 ||
        append_spans(blob, n, rows->kstart, rows->klen, f[F_KDATA], f[F_KOFFS], f[F_KVALID]) < 0 ||
        append_spans(blob, n, rows->vstart, rows->vlen, f[F_VDATA], f[F_VOFFS], f[F_VVALID]) < 0 ||
        append_spans(blob, hdrs->n, hdrs->kstart, hdrs->klen, f[F_HKDATA], f[F_HKOFFS], NULL) < 0 ||
        append_spans(blob, hdrs->n, hdrs->vstart, hdrs->vlen, f[F_HVDATA], f[F_HVOFFS],
                     f[F_HVVALID]) < 0)
        goto done;
    rc = 0;
done:
    for (size_t i = 0; i < NFIELDS; i++)
        Py_XDECREF(f[i]);
    return rc;
}

static void
raise_failure(Failure fl, long long count, int64_t base_offset)
{
    switch (fl.code) {
    case E_NOMEM:
        PyErr_NoMemory();
        break;
    case E_PAST:
        PyErr_SetString(CorruptRecordError, "record runs past the end of its batch");
        break;
    case E_LONG:
        PyErr_SetString(CorruptRecordError, "varint longer than 10 bytes");
        break;
    case E_LENGTH:
        PyErr_Format(CorruptRecordError, "record length %lld does not fit its batch",
                     (long long)fl.value);
        break;
    case E_NEG_HEADERS:
        PyErr_Format(CorruptRecordError, "negative header count %lld", (long long)fl.value);
        break;
    case E_NULL_HKEY:
        PyErr_SetString(CorruptRecordError, "null header key");
        break;
    case E_UTF8:
        PyErr_SetString(CorruptRecordError, "record header key is not valid UTF-8");
        break;
    case E_FIELDS:
        PyErr_SetString(CorruptRecordError, "record fields do not add up to its declared length");
        break;
    case E_TRAILING:
        PyErr_Format(CorruptRecordError, "batch declares %lld records but %lld bytes remain after them",
                     count, (long long)fl.value);
        break;
    default:
        PyErr_Format(CorruptRecordError,
                     "record offsets overflow a 64-bit integer (base offset %lld)",
                     (long long)base_offset);
        break;
    }
}

PyDoc_STRVAR(scan_v2_doc,
"scan_v2(blob, count, base_offset, base_ts, ts_type, max_ts, cols, with_headers)\n--\n\n"
"Append ``count`` magic-2 records of a decompressed blob to ``cols`` (a columnar.Columns).\n"
"Raises CorruptRecordError exactly where _columnar_py.scan_v2 does; ``cols`` is unchanged then.");

static PyObject *
scan_v2(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer blob;
    long long count;
    int64_t base_offset, base_ts, max_ts;
    long long bo, bt, mt;
    int ts_type, with_headers;
    PyObject *cols;
    if (!PyArg_ParseTuple(args, "y*LLLiLOp:scan_v2", &blob, &count, &bo, &bt, &ts_type, &mt,
                          &cols, &with_headers))
        return NULL;
    base_offset = bo;
    base_ts = bt;
    max_ts = mt;
    Rows rows = {0};
    Headers hdrs = {0};
    Sink sink = {S_ROWS, &rows, &hdrs, NULL};
    Failure fl;
    Py_BEGIN_ALLOW_THREADS
    fl = parse((const uint8_t *)blob.buf, blob.len, count, base_offset, base_ts, ts_type == 1,
               max_ts, with_headers, &sink);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (fl.code != E_OK)
        raise_failure(fl, count, base_offset);
    else if (commit(cols, (const uint8_t *)blob.buf, &rows, &hdrs, ts_type) == 0)
        result = Py_NewRef(Py_None);
    rows_free(&rows);
    headers_free(&hdrs);
    PyBuffer_Release(&blob);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_v2", scan_v2, METH_VARARGS, scan_v2_doc},
    {"scan_run_arrow", kafkalog_scan_run_arrow, METH_VARARGS, kafkalog_scan_run_arrow_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columnar_accel",
    "C twin of the magic 2 record loop of pyspark_kafkalog.format._columnar_py.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__columnar_accel(void)
{
    PyObject *errors = PyImport_ImportModule("pyspark_kafkalog.errors");
    if (errors == NULL)
        return NULL;
    CorruptRecordError = PyObject_GetAttrString(errors, "CorruptRecordError");
    kafkalog_KafkaLogError = PyObject_GetAttrString(errors, "KafkaLogError");
    Py_DECREF(errors);
    if (CorruptRecordError == NULL || kafkalog_KafkaLogError == NULL)
        return NULL;
    s_frombytes = PyUnicode_InternFromString("frombytes");
    if (s_frombytes == NULL)
        return NULL;
    return PyModule_Create(&module);
}
