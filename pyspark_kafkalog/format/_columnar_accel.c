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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static PyObject *CorruptRecordError;   /* pyspark_kafkalog.errors.CorruptRecordError */
static PyObject *s_frombytes;          /* interned method name */

/* -- pass 1: parse ------------------------------------------------------------------------ */

enum {
    E_OK = 0,
    E_NOMEM,
    E_PAST,        /* a read at or past the end of the blob */
    E_LONG,        /* varint longer than 10 bytes */
    E_LENGTH,      /* record length < 6 or beyond the blob (value: the length) */
    E_NEG_HEADERS, /* negative header count (value: the count) */
    E_NULL_HKEY,   /* null header key */
    E_UTF8,        /* header key not UTF-8 */
    E_FIELDS,      /* fields do not add up to the record length */
    E_TRAILING,    /* bytes left after the last record (value: how many) */
    E_OFFSET,      /* an offset outside int64 */
};

typedef struct {
    Py_ssize_t n, cap;
    int64_t *offset, *timestamp, *kstart, *klen, *vstart, *vlen;
    int32_t *hcount;
} Rows;

typedef struct {
    Py_ssize_t n, cap;
    int64_t *kstart, *klen, *vstart, *vlen;
} Headers;

typedef struct {
    int code;
    int64_t value;
} Failure;

static int
grow(void **p, Py_ssize_t cap, size_t item)
{
    void *q = realloc(*p, (size_t)cap * item);
    if (q == NULL)
        return -1;
    *p = q;
    return 0;
}

static int
rows_reserve(Rows *r, Py_ssize_t want)
{
    if (want <= r->cap)
        return 0;
    Py_ssize_t cap = r->cap ? r->cap * 2 : 64;
    if (cap < want)
        cap = want;
    if (grow((void **)&r->offset, cap, 8) || grow((void **)&r->timestamp, cap, 8) ||
        grow((void **)&r->kstart, cap, 8) || grow((void **)&r->klen, cap, 8) ||
        grow((void **)&r->vstart, cap, 8) || grow((void **)&r->vlen, cap, 8) ||
        grow((void **)&r->hcount, cap, 4))
        return -1;
    r->cap = cap;
    return 0;
}

static int
headers_reserve(Headers *h, Py_ssize_t want)
{
    if (want <= h->cap)
        return 0;
    Py_ssize_t cap = h->cap ? h->cap * 2 : 64;
    if (cap < want)
        cap = want;
    if (grow((void **)&h->kstart, cap, 8) || grow((void **)&h->klen, cap, 8) ||
        grow((void **)&h->vstart, cap, 8) || grow((void **)&h->vlen, cap, 8))
        return -1;
    h->cap = cap;
    return 0;
}

static void
rows_free(Rows *r)
{
    free(r->offset); free(r->timestamp); free(r->kstart); free(r->klen);
    free(r->vstart); free(r->vlen); free(r->hcount);
}

static void
headers_free(Headers *h)
{
    free(h->kstart); free(h->klen); free(h->vstart); free(h->vlen);
}

/* Zig-zag varint at *pos, taken modulo 2**64 like Java's readVarlong. Reads stop at `end` (the
 * blob's end); *pos may already be past it after a length that overran. */
static inline int
read_varint(const uint8_t *b, Py_ssize_t end, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t p = *pos;
    if (p >= end)
        return E_PAST;
    uint64_t c = b[p];
    if (c < 0x80) {
        *pos = p + 1;
        *out = (int64_t)((c >> 1) ^ (0 - (c & 1)));
        return E_OK;
    }
    uint64_t result = c & 0x7f;
    int shift = 7;
    p++;
    for (;;) {
        if (p >= end)
            return E_PAST;
        c = b[p++];
        result |= (c & 0x7f) << shift;   /* bits beyond 64 are dropped, as in Python's mask */
        if (c < 0x80)
            break;
        shift += 7;
        if (shift > 63)
            return E_LONG;
    }
    *pos = p;
    *out = (int64_t)((result >> 1) ^ (0 - (result & 1)));
    return E_OK;
}

/* Strict UTF-8 as CPython's decoder accepts it (Unicode table 3-7: no overlongs, surrogates or
 * code points past U+10FFFF). */
static int
utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
        }
        else
            return 0;
        if (n - i <= need)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += need + 1;
    }
    return 1;
}

static inline int
add_overflows(int64_t a, int64_t b, int64_t *out)
{
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b))
        return 1;
    *out = a + b;
    return 0;
}

#define READ(var)                                           \
    do {                                                    \
        int rc_ = read_varint(b, end, &pos, &(var));        \
        if (rc_ != E_OK) { f.code = rc_; return f; }        \
    } while (0)

/* Skip `len` bytes from pos; past the blob, pos lands just beyond it so the next read fails
 * with E_PAST and the record-end check with E_FIELDS, as Python's unbounded pos would. */
#define SKIP(len)                                           \
    do {                                                    \
        if ((len) > end - pos) pos = end + 1;               \
        else pos += (len);                                  \
    } while (0)

static Failure
parse(const uint8_t *b, Py_ssize_t end, long long count, int64_t base_offset, int64_t base_ts,
      int log_append, int64_t max_ts, int with_headers, Rows *rows, Headers *hdrs)
{
    Failure f = {E_OK, 0};
    Py_ssize_t pos = 0;
    int offset_overflow = 0;
    /* each record takes at least 7 bytes, so a count beyond that bound can only fail */
    Py_ssize_t bound = end / 7 + 1;
    if (rows_reserve(rows, (Py_ssize_t)(count < bound ? (count < 65536 ? count : 65536)
                                                       : (bound < 65536 ? bound : 65536)))) {
        f.code = E_NOMEM;
        return f;
    }
    for (long long i = 0; i < count; i++) {
        int64_t length, ts_delta, off_delta, klen, vlen, nh;
        READ(length);
        if (length < 6 || length > end - pos) {
            f.code = E_LENGTH;
            f.value = length;
            return f;
        }
        Py_ssize_t rec_end = pos + (Py_ssize_t)length;
        pos += 1;   /* attributes */
        READ(ts_delta);
        READ(off_delta);
        READ(klen);
        int64_t kstart = pos;
        if (klen >= 0)
            SKIP(klen);
        READ(vlen);
        int64_t vstart = pos;
        if (vlen >= 0)
            SKIP(vlen);
        READ(nh);
        if (nh < 0) {
            f.code = E_NEG_HEADERS;
            f.value = nh;
            return f;
        }
        for (int64_t h = 0; h < nh; h++) {
            int64_t hk_len, hv_len;
            READ(hk_len);
            if (hk_len < 0) {
                f.code = E_NULL_HKEY;
                return f;
            }
            int64_t hk_start = pos;
            SKIP(hk_len);
            READ(hv_len);   /* succeeds only if the key was whole */
            if (with_headers) {
                const uint8_t *k = b + hk_start;
                for (int64_t j = 0; j < hk_len; j++) {
                    if (k[j] >= 0x80) {
                        if (!utf8_valid(k, (Py_ssize_t)hk_len)) {
                            f.code = E_UTF8;
                            return f;
                        }
                        break;
                    }
                }
                if (hdrs->n == hdrs->cap && headers_reserve(hdrs, hdrs->n + 1)) {
                    f.code = E_NOMEM;
                    return f;
                }
                hdrs->kstart[hdrs->n] = hk_start;
                hdrs->klen[hdrs->n] = hk_len;
                hdrs->vstart[hdrs->n] = pos;
                hdrs->vlen[hdrs->n] = hv_len < 0 ? -1 : hv_len;
                hdrs->n++;
            }
            if (hv_len >= 0)
                SKIP(hv_len);
        }
        if (pos != rec_end) {
            f.code = E_FIELDS;
            return f;
        }
        if (rows->n == rows->cap && rows_reserve(rows, rows->n + 1)) {
            f.code = E_NOMEM;
            return f;
        }
        Py_ssize_t r = rows->n++;
        if (add_overflows(base_offset, off_delta, &rows->offset[r])) {
            offset_overflow = 1;
            rows->offset[r] = 0;
        }
        rows->timestamp[r] = log_append ? max_ts
                                        : (int64_t)((uint64_t)base_ts + (uint64_t)ts_delta);
        rows->kstart[r] = kstart;
        rows->klen[r] = klen < 0 ? -1 : klen;
        rows->vstart[r] = vstart;
        rows->vlen[r] = vlen < 0 ? -1 : vlen;
        rows->hcount[r] = with_headers ? (int32_t)nh : 0;
    }
    if (pos != end) {
        f.code = E_TRAILING;
        f.value = (int64_t)(end - pos);
        return f;
    }
    if (offset_overflow)
        f.code = E_OFFSET;
    return f;
}

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
    Failure fl;
    Py_BEGIN_ALLOW_THREADS
    fl = parse((const uint8_t *)blob.buf, blob.len, count, base_offset, base_ts, ts_type == 1,
               max_ts, with_headers, &rows, &hdrs);
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
    Py_DECREF(errors);
    if (CorruptRecordError == NULL)
        return NULL;
    s_frombytes = PyUnicode_InternFromString("frombytes");
    if (s_frombytes == NULL)
        return NULL;
    return PyModule_Create(&module);
}
