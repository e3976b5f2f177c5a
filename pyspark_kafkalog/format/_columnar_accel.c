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

/* -- where parsed records go ------------------------------------------------------------
 *
 * One parser serves three sinks, so the rules for what is valid exist once:
 *   S_ROWS   spans into scratch Rows/Headers (scan_v2, appended to a Columns afterwards);
 *   S_COUNT  totals only (scan_v2_arrow's first pass: sizes its output buffers exactly);
 *   S_FILL   Arrow-layout buffers sized by S_COUNT (scan_v2_arrow's second pass).
 */

enum { S_ROWS, S_COUNT, S_FILL };

/* |ms| below this fits Spark's microsecond timestamps (2**63 // 1000) */
#define MAX_MS ((int64_t)9223372036854775LL)

typedef struct {
    /* S_COUNT totals */
    Py_ssize_t rows, kbytes, vbytes, knulls, vnulls, hdrs, hkbytes, hvbytes, hvnulls;
    int ts_out_of_range;
    /* S_FILL outputs (Arrow layouts: int32 offsets from 0, LSB-first validity bits) */
    int64_t *offset, *ts_us;
    int32_t *ts_type, *koffs, *voffs, *hoffs, *hkoffs, *hvoffs;
    uint8_t *kdata, *vdata, *hkdata, *hvdata, *kvalid, *vvalid, *hvvalid;
    Py_ssize_t r, k, v, h, hk, hv;   /* S_FILL cursors */
    int32_t batch_ts_type;
} Out;

typedef struct {
    int mode;
    Rows *rows;
    Headers *hdrs;
    Out *out;
} Sink;

static inline int
emit_header(Sink *s, const uint8_t *b, int64_t kstart, int64_t klen, int64_t vstart, int64_t vlen)
{
    if (s->mode == S_ROWS) {
        Headers *hdrs = s->hdrs;
        if (hdrs->n == hdrs->cap && headers_reserve(hdrs, hdrs->n + 1))
            return -1;
        hdrs->kstart[hdrs->n] = kstart;
        hdrs->klen[hdrs->n] = klen;
        hdrs->vstart[hdrs->n] = vstart;
        hdrs->vlen[hdrs->n] = vlen < 0 ? -1 : vlen;
        hdrs->n++;
        return 0;
    }
    Out *o = s->out;
    if (s->mode == S_COUNT) {
        o->hdrs++;
        o->hkbytes += (Py_ssize_t)klen;
        if (vlen >= 0)
            o->hvbytes += (Py_ssize_t)vlen;
        else
            o->hvnulls++;
        return 0;
    }
    Py_ssize_t h = o->h++;
    memcpy(o->hkdata + o->hk, b + kstart, (size_t)klen);
    o->hk += (Py_ssize_t)klen;
    o->hkoffs[h + 1] = (int32_t)o->hk;
    if (vlen >= 0) {
        memcpy(o->hvdata + o->hv, b + vstart, (size_t)vlen);
        o->hv += (Py_ssize_t)vlen;
        o->hvvalid[h >> 3] |= (uint8_t)(1u << (h & 7));
    }
    else
        o->hvnulls++;
    o->hvoffs[h + 1] = (int32_t)o->hv;
    return 0;
}

static inline int
emit_row(Sink *s, const uint8_t *b, int64_t offset, int64_t ts, int64_t kstart, int64_t klen,
         int64_t vstart, int64_t vlen, int32_t nh)
{
    if (s->mode == S_ROWS) {
        Rows *rows = s->rows;
        if (rows->n == rows->cap && rows_reserve(rows, rows->n + 1))
            return -1;
        Py_ssize_t r = rows->n++;
        rows->offset[r] = offset;
        rows->timestamp[r] = ts;
        rows->kstart[r] = kstart;
        rows->klen[r] = klen < 0 ? -1 : klen;
        rows->vstart[r] = vstart;
        rows->vlen[r] = vlen < 0 ? -1 : vlen;
        rows->hcount[r] = nh;
        return 0;
    }
    Out *o = s->out;
    if (s->mode == S_COUNT) {
        o->rows++;
        if (klen >= 0)
            o->kbytes += (Py_ssize_t)klen;
        else
            o->knulls++;
        if (vlen >= 0)
            o->vbytes += (Py_ssize_t)vlen;
        else
            o->vnulls++;
        if (ts <= -MAX_MS || ts >= MAX_MS)
            o->ts_out_of_range = 1;
        return 0;
    }
    Py_ssize_t r = o->r++;
    if (ts <= -MAX_MS || ts >= MAX_MS) {
        o->ts_out_of_range = 1;
        ts = 0;
    }
    o->offset[r] = offset;
    o->ts_us[r] = ts * 1000;
    o->ts_type[r] = o->batch_ts_type;
    if (klen >= 0) {
        memcpy(o->kdata + o->k, b + kstart, (size_t)klen);
        o->k += (Py_ssize_t)klen;
        o->kvalid[r >> 3] |= (uint8_t)(1u << (r & 7));
    }
    else
        o->knulls++;
    o->koffs[r + 1] = (int32_t)o->k;
    if (vlen >= 0) {
        memcpy(o->vdata + o->v, b + vstart, (size_t)vlen);
        o->v += (Py_ssize_t)vlen;
        o->vvalid[r >> 3] |= (uint8_t)(1u << (r & 7));
    }
    else
        o->vnulls++;
    o->voffs[r + 1] = (int32_t)o->v;
    if (o->hoffs != NULL)
        o->hoffs[r + 1] = o->hoffs[r] + nh;
    return 0;
}

static Failure
parse(const uint8_t *b, Py_ssize_t end, long long count, int64_t base_offset, int64_t base_ts,
      int log_append, int64_t max_ts, int with_headers, Sink *sink)
{
    Failure f = {E_OK, 0};
    Py_ssize_t pos = 0;
    int offset_overflow = 0;
    /* each record takes at least 7 bytes, so a count beyond that bound can only fail */
    Py_ssize_t bound = end / 7 + 1;
    if (sink->mode == S_ROWS &&
        rows_reserve(sink->rows, (Py_ssize_t)(count < bound ? (count < 65536 ? count : 65536)
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
                if (emit_header(sink, b, hk_start, hk_len, pos, hv_len) < 0) {
                    f.code = E_NOMEM;
                    return f;
                }
            }
            if (hv_len >= 0)
                SKIP(hv_len);
        }
        if (pos != rec_end) {
            f.code = E_FIELDS;
            return f;
        }
        int64_t offset;
        if (add_overflows(base_offset, off_delta, &offset)) {
            offset_overflow = 1;
            offset = 0;
        }
        int64_t ts = log_append ? max_ts : (int64_t)((uint64_t)base_ts + (uint64_t)ts_delta);
        if (emit_row(sink, b, offset, ts, kstart, klen, vstart, vlen,
                     with_headers ? (int32_t)nh : 0) < 0) {
            f.code = E_NOMEM;
            return f;
        }
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

/* -- scan_v2_arrow: a run of batches straight into Arrow buffers -------------------------- */

typedef struct {
    Py_buffer blob;
    long long count, base_offset, base_ts, max_ts;
    int ts_type;
} Item;

/* A writable buffer of `size` bytes from the `allocate` callable (Arrow's pool, in practice),
 * kept in `objs` for the result; NULL with an exception set on failure. */
static uint8_t *
take_buffer(PyObject *allocate, Py_ssize_t size, PyObject **obj, Py_buffer *view)
{
    *obj = PyObject_CallFunction(allocate, "n", size);
    if (*obj == NULL)
        return NULL;
    if (PyObject_GetBuffer(*obj, view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (view->len < size) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "allocate() returned a buffer that is too small");
        return NULL;
    }
    return (uint8_t *)view->buf;
}

enum { B_OFFSET, B_TS, B_TS_TYPE, B_KVALID, B_KOFFS, B_KDATA, B_VVALID, B_VOFFS, B_VDATA,
       B_HOFFS, B_HKOFFS, B_HKDATA, B_HVVALID, B_HVOFFS, B_HVDATA, NBUF };

PyDoc_STRVAR(scan_v2_arrow_doc,
"scan_v2_arrow(items, with_headers, allocate)\n--\n\n"
"Decode a run of magic-2 batches into Arrow buffers sized exactly, in two passes (count, fill).\n"
"``items``: a list of (blob, count, base_offset, base_ts, ts_type, max_ts) per batch.\n"
"``allocate(n)``: a writable buffer of n bytes. Returns (rows, knulls, vnulls, hdrs, hvnulls,\n"
"buffers) with buffers in the order offset, timestamp (us), timestampType (int32), key validity,\n"
"key offsets (int32), key data, the same for value, then headers' list offsets, key offsets,\n"
"key data, value validity, value offsets, value data (None without headers). Returns None when\n"
"the run is not for this path: any record scan_v2 would reject, a timestamp outside Spark's\n"
"range, or more than 2 GiB in one column.");

static PyObject *
scan_v2_arrow(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *items, *allocate;
    int with_headers;
    if (!PyArg_ParseTuple(args, "O!pO:scan_v2_arrow", &PyList_Type, &items, &with_headers,
                          &allocate))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items), got = 0;
    Item *it = (Item *)calloc((size_t)(n ? n : 1), sizeof(Item));
    PyObject *objs[NBUF] = {NULL};
    Py_buffer views[NBUF];
    int have_view[NBUF] = {0};
    PyObject *result = NULL;
    if (it == NULL)
        return PyErr_NoMemory();
    for (; got < n; got++) {
        Item *x = &it[got];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(items, got), "y*LLLiL:scan_v2_arrow item",
                              &x->blob, &x->count, &x->base_offset, &x->base_ts, &x->ts_type,
                              &x->max_ts))
            goto done;
    }
    Out o;
    memset(&o, 0, sizeof(o));
    Sink sink = {S_COUNT, NULL, NULL, &o};
    int bad = 0;
    if (with_headers) {
        /* headers are counted first: no cheap bound on how many there are */
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            Failure fl = parse((const uint8_t *)it[i].blob.buf, it[i].blob.len, it[i].count,
                               it[i].base_offset, it[i].base_ts, it[i].ts_type == 1,
                               it[i].max_ts, with_headers, &sink);
            bad = fl.code != E_OK;
        }
        Py_END_ALLOW_THREADS
    }
    else {
        /* one pass: the header counts give the rows (each record takes at least 7 bytes, so a
         * larger count can only fail), and keys and values are disjoint spans of the blobs, so
         * the blobs' size bounds the bytes; Arrow's IPC writer sends only what offsets cover */
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            bad = it[i].count < 0 || it[i].count > it[i].blob.len / 7 + 1;
            o.rows += (Py_ssize_t)it[i].count;
            o.kbytes += it[i].blob.len;
        }
        o.vbytes = o.kbytes;
    }
    if (bad || o.ts_out_of_range || o.kbytes > INT32_MAX || o.vbytes > INT32_MAX ||
        o.hkbytes > INT32_MAX || o.hvbytes > INT32_MAX || o.hdrs > INT32_MAX ||
        o.rows > INT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t rows = o.rows, bits = (rows + 7) / 8, hbits = (o.hdrs + 7) / 8;
    Py_ssize_t sizes[NBUF] = {
        rows * 8, rows * 8, rows * 4, bits, (rows + 1) * 4, o.kbytes, bits, (rows + 1) * 4,
        o.vbytes, (rows + 1) * 4, (o.hdrs + 1) * 4, o.hkbytes, hbits, (o.hdrs + 1) * 4, o.hvbytes,
    };
    uint8_t *ptr[NBUF] = {NULL};
    int nbuf = with_headers ? NBUF : B_HOFFS;
    for (int i = 0; i < nbuf; i++) {
        ptr[i] = take_buffer(allocate, sizes[i], &objs[i], &views[i]);
        if (ptr[i] == NULL)
            goto done;
        have_view[i] = 1;
    }
    memset(ptr[B_KVALID], 0, (size_t)bits);
    memset(ptr[B_VVALID], 0, (size_t)bits);
    o.offset = (int64_t *)ptr[B_OFFSET];
    o.ts_us = (int64_t *)ptr[B_TS];
    o.ts_type = (int32_t *)ptr[B_TS_TYPE];
    o.kvalid = ptr[B_KVALID];
    o.koffs = (int32_t *)ptr[B_KOFFS];
    o.kdata = ptr[B_KDATA];
    o.vvalid = ptr[B_VVALID];
    o.voffs = (int32_t *)ptr[B_VOFFS];
    o.vdata = ptr[B_VDATA];
    o.koffs[0] = o.voffs[0] = 0;
    if (with_headers) {
        memset(ptr[B_HVVALID], 0, (size_t)hbits);
        o.hoffs = (int32_t *)ptr[B_HOFFS];
        o.hkoffs = (int32_t *)ptr[B_HKOFFS];
        o.hkdata = ptr[B_HKDATA];
        o.hvvalid = ptr[B_HVVALID];
        o.hvoffs = (int32_t *)ptr[B_HVOFFS];
        o.hvdata = ptr[B_HVDATA];
        o.hoffs[0] = o.hkoffs[0] = o.hvoffs[0] = 0;
    }
    sink.mode = S_FILL;
    o.knulls = o.vnulls = o.hvnulls = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        o.batch_ts_type = it[i].ts_type;
        Failure fl = parse((const uint8_t *)it[i].blob.buf, it[i].blob.len, it[i].count,
                           it[i].base_offset, it[i].base_ts, it[i].ts_type == 1, it[i].max_ts,
                           with_headers, &sink);
        bad = fl.code != E_OK;
    }
    Py_END_ALLOW_THREADS
    if (bad || o.ts_out_of_range || o.r != rows) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *bufs = PyTuple_New(NBUF);
    if (bufs == NULL)
        goto done;
    for (int i = 0; i < NBUF; i++) {
        PyObject *b = objs[i] != NULL ? objs[i] : Py_None;
        Py_INCREF(b);
        PyTuple_SET_ITEM(bufs, i, b);
    }
    result = Py_BuildValue("nnnnnN", rows, o.knulls, o.vnulls, o.hdrs, o.hvnulls, bufs);
done:
    for (int i = 0; i < NBUF; i++) {
        if (have_view[i])
            PyBuffer_Release(&views[i]);
        Py_XDECREF(objs[i]);
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&it[i].blob);
    free(it);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_v2", scan_v2, METH_VARARGS, scan_v2_doc},
    {"scan_v2_arrow", scan_v2_arrow, METH_VARARGS, scan_v2_arrow_doc},
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
