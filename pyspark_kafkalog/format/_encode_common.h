/*
 * What the encoders of _encode_accel.c share (included there once): reading pyarrow binary
 * arrays and int64 buffers through the buffer protocol with every span checked, the v2 record's
 * fields and bytes (fields_at, put_record), and the error codes and their exceptions.
 */
#ifndef KAFKALOG_ENCODE_COMMON_H
#define KAFKALOG_ENCODE_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_pool.h"

static PyObject *InvalidRecordError;   /* pyspark_kafkalog.errors.InvalidRecordError */

/* The numpy path holds the records in one Arrow binary array (int32 offsets): the same limit
 * here gives both paths the same error, and keeps every batch's int32 length valid. */
#define MAX_TOTAL ((int64_t)1 << 31)

enum {
    E_OK = 0,
    E_SPAN,        /* an element's offsets leave its data buffer or run backwards */
    E_TOO_MANY,    /* the records section reaches MAX_TOTAL bytes */
    E_CHANGED,     /* pass 2 found a record of another size than pass 1 */
};

/* Unaligned-safe loads: buffers from pa.py_buffer or numpy views need not be aligned. */
static inline int32_t
ld32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline int64_t
ld64(const uint8_t *p)
{
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline void
st64(uint8_t *p, int64_t v)
{
    memcpy(p, &v, 8);
}

/* -- inputs ---------------------------------------------------------------------------------- */

/* A pyarrow binary array (int32 offsets) seen through the buffer protocol. */
typedef struct {
    PyObject *bufs;           /* arr.buffers(): keeps the buffer objects alive */
    Py_buffer view[3];        /* validity, offsets, data */
    int have[3];
    const uint8_t *valid;     /* NULL: no nulls */
    const uint8_t *offs;      /* int32 entries; element i spans offs[off + i]..offs[off + i + 1] */
    const uint8_t *data;
    Py_ssize_t data_len, off, n;
} Binary;

static void
binary_close(Binary *b)
{
    for (int i = 0; i < 3; i++)
        if (b->have[i])
            PyBuffer_Release(&b->view[i]);
    Py_CLEAR(b->bufs);
}

static int
binary_open(PyObject *arr, const char *what, Py_ssize_t n, Binary *b)
{
    memset(b, 0, sizeof(*b));
    Py_ssize_t len = PyObject_Length(arr);
    if (len < 0)
        return -1;
    if (len != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd elements, expected %zd", what, len, n);
        return -1;
    }
    PyObject *off = PyObject_GetAttrString(arr, "offset");
    if (off == NULL)
        return -1;
    b->off = PyLong_AsSsize_t(off);
    Py_DECREF(off);
    if (b->off == -1 && PyErr_Occurred())
        return -1;
    b->bufs = PyObject_CallMethod(arr, "buffers", NULL);
    if (b->bufs == NULL)
        return -1;
    if (!PyList_Check(b->bufs) || PyList_GET_SIZE(b->bufs) != 3) {
        PyErr_Format(PyExc_TypeError, "%s must be a pyarrow binary array", what);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        PyObject *item = PyList_GET_ITEM(b->bufs, i);
        if (item == Py_None)
            continue;
        if (PyObject_GetBuffer(item, &b->view[i], PyBUF_SIMPLE) < 0)
            return -1;
        b->have[i] = 1;
    }
    b->n = n;
    if (n == 0)
        return 0;
    /* the offsets the elements use, and the validity bits, must lie inside their buffers */
    if (b->off < 0 || b->off > PY_SSIZE_T_MAX / 4 - n - 1 || !b->have[1] ||
        b->view[1].len / 4 < b->off + n + 1 ||
        (b->have[0] && b->view[0].len < (b->off + n + 7) / 8)) {
        PyErr_Format(PyExc_ValueError, "%s: offset %zd and %zd elements do not fit its buffers",
                     what, b->off, n);
        return -1;
    }
    b->valid = b->have[0] ? (const uint8_t *)b->view[0].buf : NULL;
    b->offs = (const uint8_t *)b->view[1].buf;
    b->data = b->have[2] ? (const uint8_t *)b->view[2].buf : NULL;
    b->data_len = b->have[2] ? b->view[2].len : 0;
    return 0;
}

/* Element i: its start and length in data, length -1 for null (Kafka's null). */
static inline int
span(const Binary *b, Py_ssize_t i, int64_t *start, int64_t *len)
{
    Py_ssize_t j = b->off + i;
    if (b->valid != NULL && !((b->valid[j >> 3] >> (j & 7)) & 1)) {
        *start = 0;
        *len = -1;
        return E_OK;
    }
    int32_t s = ld32(b->offs + 4 * j), e = ld32(b->offs + 4 * (j + 1));
    if (s < 0 || e < s || e > b->data_len)
        return E_SPAN;
    *start = s;
    *len = (int64_t)e - s;
    return E_OK;
}

/* A C-contiguous int64 buffer of `want` entries (any when want < 0). */
static int
int64_open(PyObject *obj, const char *what, Py_ssize_t want, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *fmt = view->format != NULL ? view->format : "B";
    if (*fmt == '@' || *fmt == '=' || (PY_LITTLE_ENDIAN && *fmt == '<'))
        fmt++;
    if (view->itemsize != 8 || (strcmp(fmt, "q") != 0 && strcmp(fmt, "l") != 0)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be an int64 array", what);
        return -1;
    }
    if (want >= 0 && view->len / 8 != want) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, expected %zd", what,
                     view->len / 8, want);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* -- records --------------------------------------------------------------------------------- */

typedef struct {
    Binary key, value, hrec;
    int with_hrec;
    const uint8_t *ts;        /* int64 ms per row */
    const uint8_t *hcount;    /* int64 per row, NULL: all zero */
    const int64_t *bounds;    /* our copy, validated */
    Py_ssize_t nbounds;
} Input;

/* An Input's columns opened from the Python objects the encoders take (key, value: binary
 * arrays of n rows; timestamps: int64 of n; hrec: binary or None; hcount: int64 or None). The
 * views are held until input_close, which is safe on a partly opened one. */
typedef struct {
    Input in;
    Py_buffer ts_view, hc_view;
    int have_ts, have_hc;
} OpenInput;

static void
input_close(OpenInput *o)
{
    if (o->have_hc)
        PyBuffer_Release(&o->hc_view);
    if (o->have_ts)
        PyBuffer_Release(&o->ts_view);
    binary_close(&o->in.hrec);
    binary_close(&o->in.value);
    binary_close(&o->in.key);
}

static int
input_open(OpenInput *o, PyObject *key, PyObject *value, PyObject *ts_obj, PyObject *hrec_obj,
           PyObject *hcount_obj, Py_ssize_t n)
{
    memset(o, 0, sizeof(*o));
    Input *in = &o->in;
    if (binary_open(key, "key", n, &in->key) < 0 || binary_open(value, "value", n, &in->value) < 0)
        return -1;
    if (hrec_obj != Py_None) {
        if (binary_open(hrec_obj, "hrec", n, &in->hrec) < 0)
            return -1;
        in->with_hrec = 1;
    }
    if (int64_open(ts_obj, "timestamps", n, &o->ts_view) < 0)
        return -1;
    o->have_ts = 1;
    in->ts = (const uint8_t *)o->ts_view.buf;
    if (hcount_obj != Py_None) {
        if (int64_open(hcount_obj, "hcount", n, &o->hc_view) < 0)
            return -1;
        o->have_hc = 1;
        in->hcount = (const uint8_t *)o->hc_view.buf;
    }
    return 0;
}

typedef struct {
    uint64_t zbody, zts, zoff, zk, zv, zhc;
    int64_t kstart, klen, vstart, vlen, hstart, hlen;
    int64_t size;             /* the whole record, its length varint included */
} Fields;

static inline uint64_t
zigzag(int64_t x)
{
    return ((uint64_t)x << 1) ^ (0 - ((uint64_t)x >> 63));
}

static inline int64_t
varint_size(uint64_t u)
{
    int64_t s = 1;
    while (u >= 0x80) {
        u >>= 7;
        s++;
    }
    return s;
}

static inline uint8_t *
put_varint(uint8_t *p, uint64_t u)
{
    while (u >= 0x80) {
        *p++ = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    *p++ = (uint8_t)u;
    return p;
}

/* Row i of an input, as the record `off_delta` places after the first record of a batch whose
 * base timestamp is `base_ts`; the inputs are read once. */
static inline int
fields_at(const Input *in, Py_ssize_t i, int64_t base_ts, int64_t off_delta, Fields *f)
{
    if (span(&in->key, i, &f->kstart, &f->klen) != E_OK ||
        span(&in->value, i, &f->vstart, &f->vlen) != E_OK)
        return E_SPAN;
    f->hstart = f->hlen = 0;
    if (in->with_hrec) {
        if (span(&in->hrec, i, &f->hstart, &f->hlen) != E_OK)
            return E_SPAN;
        if (f->hlen < 0)      /* the numpy path's join writes a null as no bytes */
            f->hlen = 0;
    }
    /* Kafka computes the delta in long arithmetic: wrap, as numpy's int64 subtraction does */
    f->zts = zigzag((int64_t)((uint64_t)ld64(in->ts + 8 * i) - (uint64_t)base_ts));
    f->zoff = zigzag(off_delta);
    f->zk = zigzag(f->klen);
    f->zv = zigzag(f->vlen);
    f->zhc = zigzag(in->hcount != NULL ? ld64(in->hcount + 8 * i) : 0);
    /* every term is below 2**32, so the sum cannot overflow */
    int64_t body = 1 + varint_size(f->zts) + varint_size(f->zoff) + varint_size(f->zk) +
                   (f->klen > 0 ? f->klen : 0) + varint_size(f->zv) +
                   (f->vlen > 0 ? f->vlen : 0) + varint_size(f->zhc) + f->hlen;
    f->zbody = zigzag(body);
    f->size = varint_size(f->zbody) + body;
    return E_OK;
}

/* Row i of the batch that starts at row `start` of the same input. */
static inline int
fields_of(const Input *in, Py_ssize_t i, Py_ssize_t start, Fields *f)
{
    return fields_at(in, i, ld64(in->ts + 8 * start), (int64_t)(i - start), f);
}

/* The record of `f` at p (f->size bytes). */
static inline void
put_record(uint8_t *p, const Input *in, const Fields *f)
{
    p = put_varint(p, f->zbody);
    *p++ = 0;   /* attributes: unused in v2 records */
    p = put_varint(p, f->zts);
    p = put_varint(p, f->zoff);
    p = put_varint(p, f->zk);
    if (f->klen > 0) {
        memcpy(p, in->key.data + f->kstart, (size_t)f->klen);
        p += f->klen;
    }
    p = put_varint(p, f->zv);
    if (f->vlen > 0) {
        memcpy(p, in->value.data + f->vstart, (size_t)f->vlen);
        p += f->vlen;
    }
    p = put_varint(p, f->zhc);
    if (f->hlen > 0)
        memcpy(p, in->hrec.data + f->hstart, (size_t)f->hlen);
}

/* Pass 1: offs[i] = where record i starts, offs[n] = the total. */
static int
size_records(const Input *in, uint8_t *offs)
{
    int64_t total = 0;
    Fields f;
    st64(offs, 0);
    for (Py_ssize_t k = 0; k + 1 < in->nbounds; k++) {
        Py_ssize_t a = (Py_ssize_t)in->bounds[k], b = (Py_ssize_t)in->bounds[k + 1];
        for (Py_ssize_t i = a; i < b; i++) {
            int rc = fields_of(in, i, a, &f);
            if (rc != E_OK)
                return rc;
            total += f.size;
            if (total >= MAX_TOTAL)
                return E_TOO_MANY;
            st64(offs + 8 * (i + 1), total);
        }
    }
    return E_OK;
}

/* Pass 2: each record into the space pass 1 gave it. */
static int
fill_records(const Input *in, const uint8_t *offs, uint8_t *out)
{
    Fields f;
    for (Py_ssize_t k = 0; k + 1 < in->nbounds; k++) {
        Py_ssize_t a = (Py_ssize_t)in->bounds[k], b = (Py_ssize_t)in->bounds[k + 1];
        for (Py_ssize_t i = a; i < b; i++) {
            int rc = fields_of(in, i, a, &f);
            if (rc != E_OK)
                return rc;
            int64_t at = ld64(offs + 8 * i);
            if (f.size != ld64(offs + 8 * (i + 1)) - at)
                return E_CHANGED;
            put_record(out + at, in, &f);
        }
    }
    return E_OK;
}

static void
raise_failure(int code)
{
    switch (code) {
    case E_TOO_MANY:
        PyErr_SetString(InvalidRecordError, "too many records for one encode call");
        break;
    case E_SPAN:
        PyErr_SetString(PyExc_ValueError,
                        "an element's offsets leave its array's data buffer");
        break;
    default:
        PyErr_SetString(PyExc_RuntimeError,
                        "an input array changed while its records were being encoded");
        break;
    }
}

/* Our copy of bounds: 0 = bounds[0] <= bounds[1] <= ... <= bounds[-1] = n. */
static int64_t *
copy_bounds(PyObject *obj, Py_ssize_t n, Py_ssize_t *count)
{
    Py_buffer v;
    if (int64_open(obj, "bounds", -1, &v) < 0)
        return NULL;
    Py_ssize_t m = v.len / 8;
    int64_t *out = m >= 2 ? (int64_t *)malloc((size_t)m * 8) : NULL;
    if (m >= 2 && out == NULL) {
        PyBuffer_Release(&v);
        PyErr_NoMemory();
        return NULL;
    }
    int ok = m >= 2;
    for (Py_ssize_t k = 0; ok && k < m; k++) {
        out[k] = ld64((const uint8_t *)v.buf + 8 * k);
        ok = k == 0 ? out[k] == 0 : out[k] >= out[k - 1];
    }
    PyBuffer_Release(&v);
    if (!ok || out[m - 1] != n) {
        free(out);
        PyErr_Format(PyExc_ValueError,
                     "bounds must rise from 0 to the %zd rows without going back", n);
        return NULL;
    }
    *count = m;
    return out;
}

#endif  /* KAFKALOG_ENCODE_COMMON_H */
