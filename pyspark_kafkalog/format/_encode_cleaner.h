/* The log cleaner's hot loops (log/offset_map.py, log/cleaner.py), included once by
 * _encode_accel.c after _encode_common.h. Optional like the rest of the module: the Python
 * twins (offset_map.py's murmur3/numpy code, cleaner.py's record walk) are the reference and
 * give the same results.
 *
 * - key_digests: MurmurHash3_x64_128 (seed 0) of every key of an Arrow-style binary column
 *   (int64 offsets + data), the 128-bit digest the offset map stores in place of the key
 *   (Kafka's SkimpyOffsetMap stores an MD5; any well-mixed 128-bit hash serves, and this one is
 *   ten times cheaper per short key).
 * - offset_map_put / offset_map_get: the open-addressing table of log/offset_map.py. A slot is
 *   three int64 (digest high half, low half, offset); an empty slot has offset -1. Double
 *   hashing over a prime number of slots: probe i of a digest (h0, h1) is
 *   (h0 + i * (1 + h1 % (slots - 1))) % slots, which visits every slot.
 * - filter_v2_records: the records of a (decompressed) magic 2 batch that the cleaner keeps,
 *   byte for byte, or with their timestamp delta rebased when the batch gets a delete horizon.
 * All inputs are checked against their buffers: a bad input raises, never reads out of bounds.
 */
#ifndef KAFKALOG_ENCODE_CLEANER_H
#define KAFKALOG_ENCODE_CLEANER_H

#include "_encode_common.h"

/* -- MurmurHash3_x64_128 (Austin Appleby's public-domain algorithm), seed 0 ----------------- */

static inline uint64_t
mm3_rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t
mm3_fmix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline uint64_t
mm3_load64(const uint8_t *p)
{
    /* little-endian whatever the host, as the algorithm reads its blocks on x86 */
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static void
murmur3_128(const uint8_t *data, int64_t len, uint64_t *out)
{
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = 0, h2 = 0;
    int64_t nblocks = len / 16;
    for (int64_t i = 0; i < nblocks; i++) {
        uint64_t k1 = mm3_load64(data + i * 16), k2 = mm3_load64(data + i * 16 + 8);
        k1 *= c1; k1 = mm3_rotl(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = mm3_rotl(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = mm3_rotl(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = mm3_rotl(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }
    const uint8_t *tail = data + nblocks * 16;
    uint64_t k1 = 0, k2 = 0;
    switch (len & 15) {
    case 15: k2 ^= (uint64_t)tail[14] << 48; /* fall through */
    case 14: k2 ^= (uint64_t)tail[13] << 40; /* fall through */
    case 13: k2 ^= (uint64_t)tail[12] << 32; /* fall through */
    case 12: k2 ^= (uint64_t)tail[11] << 24; /* fall through */
    case 11: k2 ^= (uint64_t)tail[10] << 16; /* fall through */
    case 10: k2 ^= (uint64_t)tail[9] << 8; /* fall through */
    case 9:
        k2 ^= (uint64_t)tail[8];
        k2 *= c2; k2 = mm3_rotl(k2, 33); k2 *= c1; h2 ^= k2;
        /* fall through */
    case 8: k1 ^= (uint64_t)tail[7] << 56; /* fall through */
    case 7: k1 ^= (uint64_t)tail[6] << 48; /* fall through */
    case 6: k1 ^= (uint64_t)tail[5] << 40; /* fall through */
    case 5: k1 ^= (uint64_t)tail[4] << 32; /* fall through */
    case 4: k1 ^= (uint64_t)tail[3] << 24; /* fall through */
    case 3: k1 ^= (uint64_t)tail[2] << 16; /* fall through */
    case 2: k1 ^= (uint64_t)tail[1] << 8; /* fall through */
    case 1:
        k1 ^= (uint64_t)tail[0];
        k1 *= c1; k1 = mm3_rotl(k1, 31); k1 *= c2; h1 ^= k1;
    }
    h1 ^= (uint64_t)len;
    h2 ^= (uint64_t)len;
    h1 += h2;
    h2 += h1;
    h1 = mm3_fmix(h1);
    h2 = mm3_fmix(h2);
    h1 += h2;
    h2 += h1;
    out[0] = h1;
    out[1] = h2;
}

/* A buffer argument, read-only or writable, with its size checked by the caller. */
static int
cl_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
                                               : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    (void)what;
    return 0;
}

PyDoc_STRVAR(key_digests_doc,
"key_digests(offsets, data, out)\n--\n\n"
"MurmurHash3_x64_128 (seed 0) of every key ``data[offsets[i]:offsets[i+1]]`` into ``out``,\n"
"a writable buffer of ``2 * n`` uint64 (``n = len(offsets) - 1``, offsets int64).");

static PyObject *
key_digests(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *offs_obj, *data_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:key_digests", &offs_obj, &data_obj, &out_obj))
        return NULL;
    Py_buffer offs, data, out;
    if (cl_buffer(offs_obj, &offs, 0, "offsets") < 0)
        return NULL;
    if (cl_buffer(data_obj, &data, 0, "data") < 0) {
        PyBuffer_Release(&offs);
        return NULL;
    }
    if (cl_buffer(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&offs);
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = offs.len / 8 - 1;
    if (offs.len % 8 || n < 0 || out.len < n * 16) {
        PyErr_SetString(PyExc_ValueError, "key_digests: offsets or out of the wrong size");
        goto done;
    }
    const int64_t *o = (const int64_t *)offs.buf;
    const uint8_t *d = (const uint8_t *)data.buf;
    uint64_t *dst = (uint64_t *)out.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a = o[i], b = o[i + 1];
        if (a < 0 || b < a || b > data.len) {
            bad = 1;
            break;
        }
        murmur3_128(d + a, b - a, dst + 2 * i);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "key_digests: an offset is outside the data");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

/* -- the offset map's table ------------------------------------------------------------------ */

/* A slot is (digest high, digest low, offset + 1); 0 in the third word is an empty slot, so a
 * zeroed table (calloc: pages the kernel zeroes when first touched) is an empty map.
 *
 * The slot of digest (h0, h1): its own, or the first empty one on its probe sequence; -1 when
 * the sequence visited every slot without either (a table with no empty slot left). */
static inline int64_t
om_find(const int64_t *table, uint64_t slots, uint64_t h0, uint64_t h1)
{
    uint64_t pos = h0 % slots, step = 1 + h1 % (slots - 1);
    for (uint64_t i = 0; i < slots; i++) {
        const int64_t *s = table + 3 * pos;
        if (s[2] == 0 || ((uint64_t)s[0] == h0 && (uint64_t)s[1] == h1))
            return (int64_t)pos;
        pos += step;
        if (pos >= slots)
            pos -= slots;
    }
    return -1;
}

/* Digests looked up this many ahead have their first slot prefetched: a table far larger than
 * the caches makes every lookup a memory round trip, and these overlap. */
#define OM_PREFETCH 8
#if defined(__GNUC__) || defined(__clang__)
#define OM_PREFETCH_SLOT(t, slots, h0) __builtin_prefetch((t) + 3 * ((h0) % (slots)), 1, 0)
#else
#define OM_PREFETCH_SLOT(t, slots, h0) ((void)0)
#endif

static int
om_args(PyObject *table_obj, PyObject *dig_obj, Py_buffer *table, Py_buffer *dig,
        uint64_t *slots, Py_ssize_t *n)
{
    if (cl_buffer(table_obj, table, 1, "table") < 0)
        return -1;
    if (cl_buffer(dig_obj, dig, 0, "digests") < 0) {
        PyBuffer_Release(table);
        return -1;
    }
    *slots = (uint64_t)(table->len / 24);
    *n = dig->len / 16;
    if (table->len % 24 || *slots < 2 || dig->len % 16) {
        PyErr_SetString(PyExc_ValueError, "offset map: table or digests of the wrong size");
        PyBuffer_Release(table);
        PyBuffer_Release(dig);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(offset_map_put_doc,
"offset_map_put(table, digests, offsets, entries, max_entries)\n--\n\n"
"Put ``(digests[i], offsets[i])`` into the table in order, each digest's offset replacing\n"
"the one it had. Stops before the first digest that is not in the table once it holds\n"
"``max_entries``. Returns ``(number put, entries now)``.");

static PyObject *
offset_map_put(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *table_obj, *dig_obj, *offs_obj;
    Py_ssize_t entries, max_entries;
    if (!PyArg_ParseTuple(args, "OOOnn:offset_map_put", &table_obj, &dig_obj, &offs_obj,
                          &entries, &max_entries))
        return NULL;
    Py_buffer table, dig, offs;
    uint64_t slots;
    Py_ssize_t n;
    if (om_args(table_obj, dig_obj, &table, &dig, &slots, &n) < 0)
        return NULL;
    if (cl_buffer(offs_obj, &offs, 0, "offsets") < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&dig);
        return NULL;
    }
    PyObject *result = NULL;
    if (offs.len != n * 8 || max_entries >= (Py_ssize_t)slots) {
        PyErr_SetString(PyExc_ValueError, "offset_map_put: offsets of the wrong size, or "
                        "max_entries not below the slots");
        goto done;
    }
    int64_t *t = (int64_t *)table.buf;
    const uint64_t *d = (const uint64_t *)dig.buf;
    const int64_t *o = (const int64_t *)offs.buf;
    Py_ssize_t i;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n; i++) {
        if (i + OM_PREFETCH < n)
            OM_PREFETCH_SLOT(t, slots, d[2 * (i + OM_PREFETCH)]);
        int64_t pos = om_find(t, slots, d[2 * i], d[2 * i + 1]);
        if (pos < 0 || o[i] < 0) {
            bad = 1;
            break;
        }
        int64_t *s = t + 3 * pos;
        if (s[2] == 0) {
            if (entries >= max_entries)
                break;
            s[0] = (int64_t)d[2 * i];
            s[1] = (int64_t)d[2 * i + 1];
            entries++;
        }
        s[2] = o[i] + 1;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "offset_map_put: a negative offset, or a full table");
        goto done;
    }
    result = Py_BuildValue("nn", i, entries);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&dig);
    PyBuffer_Release(&offs);
    return result;
}

PyDoc_STRVAR(offset_map_get_doc,
"offset_map_get(table, digests, out)\n--\n\n"
"The offset of every digest into ``out`` (int64), -1 where the table does not hold it.");

static PyObject *
offset_map_get(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *table_obj, *dig_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:offset_map_get", &table_obj, &dig_obj, &out_obj))
        return NULL;
    Py_buffer table, dig, out;
    uint64_t slots;
    Py_ssize_t n;
    if (om_args(table_obj, dig_obj, &table, &dig, &slots, &n) < 0)
        return NULL;
    if (cl_buffer(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&dig);
        return NULL;
    }
    PyObject *result = NULL;
    if (out.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "offset_map_get: out is too small");
        goto done;
    }
    const int64_t *t = (const int64_t *)table.buf;
    const uint64_t *d = (const uint64_t *)dig.buf;
    int64_t *o = (int64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + OM_PREFETCH < n)
            OM_PREFETCH_SLOT(t, slots, d[2 * (i + OM_PREFETCH)]);
        int64_t pos = om_find(t, slots, d[2 * i], d[2 * i + 1]);
        o[i] = pos < 0 ? -1 : t[3 * pos + 2] - 1;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&dig);
    PyBuffer_Release(&out);
    return result;
}

/* -- the kept records of a magic 2 batch ----------------------------------------------------- */

/* A varint (zigzag) at p, at most 10 bytes, before end; returns bytes read, 0 if malformed. */
static inline int
cl_varlong(const uint8_t *p, const uint8_t *end, int64_t *value)
{
    uint64_t raw = 0;
    for (int i = 0; i < 10 && p + i < end; i++) {
        raw |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return i + 1;
        }
    }
    return 0;
}

static inline int
cl_put_varlong(uint8_t *p, int64_t value)
{
    uint64_t raw = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 0;
    while (raw >= 0x80) {
        p[n++] = (uint8_t)(raw | 0x80);
        raw >>= 7;
    }
    p[n++] = (uint8_t)raw;
    return n;
}

PyDoc_STRVAR(filter_v2_records_doc,
"filter_v2_records(records, count, keep, ts_shift)\n--\n\n"
"The records section (uncompressed) of a magic 2 batch of ``count`` records, keeping record\n"
"``i`` where ``keep[i]`` (a uint8 buffer of ``count``) is non-zero: its bytes as they are, or,\n"
"when ``ts_shift`` is not 0, with ``ts_shift`` taken off its timestamp delta (the batch's base\n"
"timestamp moves up by ``ts_shift``). Returns the bytes; ValueError on malformed records.");

static PyObject *
filter_v2_records(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *rec_obj, *keep_obj;
    Py_ssize_t count;
    long long shift;
    if (!PyArg_ParseTuple(args, "OnOL:filter_v2_records", &rec_obj, &count, &keep_obj, &shift))
        return NULL;
    Py_buffer rec, keep;
    if (cl_buffer(rec_obj, &rec, 0, "records") < 0)
        return NULL;
    if (cl_buffer(keep_obj, &keep, 0, "keep") < 0) {
        PyBuffer_Release(&rec);
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *out = NULL;
    if (count < 0 || keep.len < count) {
        PyErr_SetString(PyExc_ValueError, "filter_v2_records: keep is shorter than count");
        goto done;
    }
    /* a rebased delta grows by at most 10 bytes and the length varint by at most 5 */
    size_t cap = (size_t)rec.len + (shift ? (size_t)count * 15 : 0) + 1;
    out = (uint8_t *)malloc(cap);
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *p = (const uint8_t *)rec.buf, *end = p + rec.len;
    const uint8_t *k = (const uint8_t *)keep.buf;
    size_t w = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t len, delta;
        int a = cl_varlong(p, end, &len);
        if (!a || len < 1 || len > end - p - a) {
            bad = 1;
            break;
        }
        const uint8_t *body = p + a, *next = body + len;
        if (k[i]) {
            if (!shift) {
                memcpy(out + w, p, (size_t)(next - p));
                w += (size_t)(next - p);
            } else {
                /* attributes int8, then the timestamp delta */
                int b = cl_varlong(body + 1, next, &delta);
                if (!b) {
                    bad = 1;
                    break;
                }
                uint8_t tmp[10];
                int nb = cl_put_varlong(tmp, delta - (int64_t)shift);
                int64_t rest = next - (body + 1 + b);
                int64_t nlen = 1 + nb + rest;
                w += (size_t)cl_put_varlong(out + w, nlen);
                out[w++] = body[0];
                memcpy(out + w, tmp, (size_t)nb);
                w += (size_t)nb;
                memcpy(out + w, body + 1 + b, (size_t)rest);
                w += (size_t)rest;
            }
        }
        p = next;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "filter_v2_records: malformed record");
        goto done;
    }
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)w);
done:
    free(out);
    PyBuffer_Release(&rec);
    PyBuffer_Release(&keep);
    return result;
}

#endif
