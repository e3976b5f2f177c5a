/*
 * C twin of the records section that pyspark_kafkalog/format/arrow_encode.py:encode_v2_chunks
 * builds with numpy and Arrow kernels: the write path of the Spark sink.
 *
 * Optional: arrow_encode.py keeps the numpy code and uses it when this module is missing or
 * KAFKALOG_PURE_PYTHON=1, so both must give the same bytes for every input they take; the numpy
 * code and encode.encode_batch_v2 are the reference. arrow_encode.py only calls in here with
 * inputs the numpy code would encode (binary arrays of the right lengths, valid bounds), so the
 * errors raised here for other inputs need not match it: they only keep memory safe.
 *
 * Two passes, both without the GIL: pass 1 sizes every record, so the output is allocated once
 * at its exact size from the caller's allocator (Arrow's pool, which reuses memory: fresh pages
 * from malloc each cost a page fault on first write); pass 2 fills it.
 * Offsets and validity bitmaps come from objects we do not own, so every span is checked
 * against its buffer in both passes, and pass 2 writes a record only if it still takes exactly
 * the space pass 1 gave it: a caller's thread changing a numpy array while the GIL is released
 * gets an error, never a write out of bounds.
 *
 * Also here, at the end: Kafka's murmur2 partitioner over a binary array, the C twin of
 * arrow_encode.py:murmur2_array / partitions_for_keys (same rules: optional, numpy reference).
 */
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

/* Row i of the batch that starts at row `start`, read from the inputs once. */
static inline int
fields_of(const Input *in, Py_ssize_t i, Py_ssize_t start, Fields *f)
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
    f->zts = zigzag((int64_t)((uint64_t)ld64(in->ts + 8 * i) - (uint64_t)ld64(in->ts + 8 * start)));
    f->zoff = zigzag((int64_t)(i - start));
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
            uint8_t *p = put_varint(out + at, f.zbody);
            *p++ = 0;   /* attributes: unused in v2 records */
            p = put_varint(p, f.zts);
            p = put_varint(p, f.zoff);
            p = put_varint(p, f.zk);
            if (f.klen > 0) {
                memcpy(p, in->key.data + f.kstart, (size_t)f.klen);
                p += f.klen;
            }
            p = put_varint(p, f.zv);
            if (f.vlen > 0) {
                memcpy(p, in->value.data + f.vstart, (size_t)f.vlen);
                p += f.vlen;
            }
            p = put_varint(p, f.zhc);
            if (f.hlen > 0)
                memcpy(p, in->hrec.data + f.hstart, (size_t)f.hlen);
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

/* -- Kafka's murmur2 partitioner ----------------------------------------------------------- */

/* Kafka's Utils.murmur2, the Java producer's default partitioner, for
 * arrow_encode.py:murmur2_array / partitions_for_keys (the numpy code there and
 * partitioner.murmur2 are the reference). Java's int arithmetic wraps: uint32_t does the same
 * here without C's undefined signed overflow, and the bits are Java's. */
#define MURMUR2_M 0x5bd1e995u
#define MURMUR2_SEED 0x9747b28cu

static inline uint32_t
murmur2(const uint8_t *p, int64_t len)
{
    /* Java's `seed ^ length`: the int length, so only its low 32 bits (an Arrow binary
     * element is below 2**31 bytes anyway) */
    uint32_t h = MURMUR2_SEED ^ (uint32_t)len;
    for (int64_t j = len >> 2; j > 0; j--, p += 4) {
        /* little-endian whatever the host: Kafka assembles the bytes by hand; compilers turn
         * this into one load on little-endian machines */
        uint32_t k = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24;
        k *= MURMUR2_M;
        k ^= k >> 24;
        k *= MURMUR2_M;
        h = (h * MURMUR2_M) ^ k;
    }
    /* the tail bytes unsigned (Java's `data[i] & 0xff`), with Java's switch fallthrough */
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)p[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)p[1] << 8;
        /* fall through */
    case 1:
        h ^= p[0];
        h *= MURMUR2_M;
    }
    h ^= h >> 13;
    h *= MURMUR2_M;
    h ^= h >> 15;
    return h;
}

/* One murmur2 per key into out: the uint32 hash when parts == 0, else the int64 partition
 * toPositive(h) % parts (parts at most 2**31: Java's toPositive leaves 31 bits, so a larger
 * count changes nothing, and 32-bit division is the cheap one).
 * A null key hashes as the empty key, as the numpy code's does: the callers mask nulls, and
 * both paths then give the same array. */
static int
murmur2_rows(const Binary *keys, uint32_t parts, uint8_t *out)
{
    static const uint8_t nothing[1] = {0};
    for (Py_ssize_t i = 0; i < keys->n; i++) {
        int64_t start, len;
        if (span(keys, i, &start, &len) != E_OK)
            return E_SPAN;
        /* an empty or null key reads no byte: the data buffer may be absent (NULL) */
        uint32_t h = len > 0 ? murmur2(keys->data + start, len) : murmur2(nothing, 0);
        if (parts == 0) {
            memcpy(out + 4 * i, &h, 4);
        } else {
            int64_t p = (int64_t)((h & 0x7fffffffu) % parts);
            st64(out + 8 * i, p);
        }
    }
    return E_OK;
}

/* A writable C-contiguous buffer of `want` items of `itemsize` bytes whose struct format is
 * one of `codes` (numpy's np.empty(n, dtype)): where the results go. */
static int
out_open(PyObject *obj, const char *what, Py_ssize_t want, Py_ssize_t itemsize,
         const char *codes, const char *type_name, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *fmt = view->format != NULL ? view->format : "B";
    if (*fmt == '@' || *fmt == '=' || (PY_LITTLE_ENDIAN && *fmt == '<'))
        fmt++;
    if (view->itemsize != itemsize || fmt[0] == '\0' || fmt[1] != '\0' ||
        strchr(codes, fmt[0]) == NULL) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a writable %s array", what, type_name);
        return -1;
    }
    if (view->len / itemsize != want) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, expected %zd", what,
                     view->len / itemsize, want);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The two entry points share this: keys, then out, then the loop without the GIL. */
static PyObject *
murmur2_into(PyObject *keys, PyObject *out, uint32_t parts)
{
    Binary b;
    Py_buffer view;
    Py_ssize_t n = PyObject_Length(keys);
    if (n < 0)
        return NULL;
    if (binary_open(keys, "keys", n, &b) < 0) {
        binary_close(&b);
        return NULL;
    }
    /* 'l'/'L' only where long has the item's size: itemsize is checked too */
    if (out_open(out, "out", n, parts == 0 ? 4 : 8, parts == 0 ? "IiLl" : "ql",
                 parts == 0 ? "uint32 or int32" : "int64", &view) < 0) {
        binary_close(&b);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = murmur2_rows(&b, parts, (uint8_t *)view.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    binary_close(&b);
    if (rc != E_OK) {
        raise_failure(rc);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(murmur2_hashes_doc,
"murmur2_hashes(keys, out)\n--\n\n"
"Kafka's ``Utils.murmur2`` of every element of ``keys`` (a pyarrow binary array, int32\n"
"offsets; slices are fine) into ``out``: a writable uint32 (or int32: Java's signed value)\n"
"array of ``len(keys)`` entries. A null key hashes as the empty key (what the numpy\n"
"``arrow_encode.murmur2_array`` gives; callers mask nulls). Returns None.");

static PyObject *
murmur2_hashes(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *keys, *out;
    if (!PyArg_ParseTuple(args, "OO:murmur2_hashes", &keys, &out))
        return NULL;
    return murmur2_into(keys, out, 0);
}

PyDoc_STRVAR(murmur2_partitions_doc,
"murmur2_partitions(keys, num_partitions, out)\n--\n\n"
"Kafka's default partition of every key, ``toPositive(murmur2(key)) % num_partitions``, into\n"
"``out``: a writable int64 array of ``len(keys)`` entries. ``keys`` as for\n"
"``murmur2_hashes`` (a null key counts as the empty key); ``num_partitions`` >= 1.\n"
"Returns None.");

static PyObject *
murmur2_partitions(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *keys, *out;
    Py_ssize_t num;
    if (!PyArg_ParseTuple(args, "OnO:murmur2_partitions", &keys, &num, &out))
        return NULL;
    if (num < 1) {
        PyErr_Format(PyExc_ValueError, "num_partitions must be at least 1, not %zd", num);
        return NULL;
    }
    /* toPositive leaves h below 2**31: h % n is h for every n from 2**31 up */
    return murmur2_into(keys, out, num > 0x80000000 ? 0x80000000u : (uint32_t)num);
}

static PyMethodDef methods[] = {
    {"encode_v2_records", encode_v2_records, METH_VARARGS, encode_v2_records_doc},
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
    return PyModule_Create(&module);
}
