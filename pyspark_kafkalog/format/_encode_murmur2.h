/* Kafka's murmur2 partitioner, included once by _encode_accel.c after _encode_common.h. */
#ifndef KAFKALOG_ENCODE_MURMUR2_H
#define KAFKALOG_ENCODE_MURMUR2_H

#include "_encode_common.h"

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

#endif  /* KAFKALOG_ENCODE_MURMUR2_H */
