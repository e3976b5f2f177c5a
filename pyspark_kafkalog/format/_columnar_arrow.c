/*
 * scan_run_arrow: a chunk of a log (whole magic 2 batches) straight into Spark's Arrow layout,
 * for pyspark_kafkalog/format/arrow_decode.py. Part of the _columnar_accel module.
 *
 * A fast path, never a second set of rules: it declines (returns None) anything it does not
 * take, and the caller's general decoder (format/columnar.py) then gives the rows or the exact
 * error. So every check here is at least as strict as batch.py, codecs.py and the shared
 * parser (_columnar_parse.h).
 */
#include "_batch_layout.h"
#include "_columnar_parse.h"
#include "_pool.h"

extern PyObject *kafkalog_KafkaLogError;   /* _columnar_accel.c */

/* -- a run of record blobs into Arrow buffers ------------------------------------------- */

typedef struct {
    const uint8_t *ptr;     /* the records blob (decompressed) */
    Py_ssize_t len;
    Py_buffer view;         /* held when has_view */
    int has_view;
    long long count, base_offset, base_ts, max_ts;
    int ts_type;
} Item;

static void
items_free(Item *it, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (it[i].has_view)
            PyBuffer_Release(&it[i].view);
    free(it);
}

enum { B_OFFSET, B_TS, B_TS_TYPE, B_KVALID, B_KOFFS, B_KDATA, B_VVALID, B_VOFFS, B_VDATA,
       B_HOFFS, B_HKOFFS, B_HKDATA, B_HVVALID, B_HVOFFS, B_HVDATA, NBUF };

static inline Failure
parse_item(const Item *x, int with_headers, Sink *sink)
{
    return parse(x->ptr, x->len, x->count, x->base_offset, x->base_ts, x->ts_type == 1,
                 x->max_ts, with_headers, sink);
}

/* The Arrow buffers of n parsed-to-be batches: a new reference to the result tuple, Py_None
 * when a batch is not for this path, NULL with an exception on failure. */
static PyObject *
arrow_from_items(const Item *it, Py_ssize_t n, int with_headers, PyObject *allocate)
{
    PyObject *objs[NBUF] = {NULL};
    Py_buffer views[NBUF];
    int have_view[NBUF] = {0};
    PyObject *result = NULL;
    Out o;
    memset(&o, 0, sizeof(o));
    Sink sink = {S_COUNT, NULL, NULL, &o};
    int bad = 0;
    if (with_headers) {
        /* headers are counted first: no cheap bound on how many there are */
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !bad; i++)
            bad = parse_item(&it[i], with_headers, &sink).code != E_OK;
        Py_END_ALLOW_THREADS
    }
    else {
        /* one pass: the header counts give the rows (each record takes at least 7 bytes, so a
         * larger count can only fail), and keys and values are disjoint spans of the blobs, so
         * the blobs' size bounds the bytes; Arrow's IPC writer sends only what offsets cover */
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            bad = it[i].count < 0 || it[i].count > it[i].len / 7 + 1;
            o.rows += (Py_ssize_t)it[i].count;
            o.kbytes += it[i].len;
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
        bad = parse_item(&it[i], with_headers, &sink).code != E_OK;
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
    return result;
}

#define ARROW_RESULT_DOC \
"Returns (rows, knulls, vnulls, hdrs, hvnulls, buffers) with buffers in the order offset,\n" \
"timestamp (us), timestampType (int32), key validity, key offsets (int32), key data, the same\n" \
"for value, then headers' list offsets, key offsets, key data, value validity, value offsets,\n" \
"value data (None without headers). Returns None when the run is not for this path: any\n" \
"record scan_v2 would reject, a timestamp outside Spark's range, or more than 2 GiB in one\n" \
"column."

/* -- scan_run_arrow: a chunk of a log, entry walk included ------------------------------- */

static inline int64_t
be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline int32_t
be32(const uint8_t *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}


/* crc_fn(view) == stored? 1 yes, 0 no, -1 error */
static int
crc_matches(PyObject *crc_fn, const uint8_t *p, Py_ssize_t len, uint32_t stored)
{
    PyObject *view = PyMemoryView_FromMemory((char *)p, len, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *got = PyObject_CallOneArg(crc_fn, view);
    Py_DECREF(view);
    if (got == NULL)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(got);
    Py_DECREF(got);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return v == (unsigned long long)stored;
}

/* -- Kafka's LZ4 frames (magic 2), as codecs._lz4_blocks walks them -------------------- */

#define XXH_P1 2654435761U
#define XXH_P2 2246822519U
#define XXH_P3 3266489917U
#define XXH_P4 668265263U
#define XXH_P5 374761393U

static inline uint32_t
rotl32(uint32_t x, int r)
{
    return (x << r) | (x >> (32 - r));
}

static inline uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* XXH32 with seed 0, for the frame descriptor checksum (a few bytes) */
static uint32_t
xxh32(const uint8_t *p, Py_ssize_t len)
{
    const uint8_t *end = p + len;
    uint32_t h;
    if (len >= 16) {
        uint32_t v1 = XXH_P1 + XXH_P2, v2 = XXH_P2, v3 = 0, v4 = 0u - XXH_P1;
        do {
            v1 = rotl32(v1 + le32(p) * XXH_P2, 13) * XXH_P1;
            v2 = rotl32(v2 + le32(p + 4) * XXH_P2, 13) * XXH_P1;
            v3 = rotl32(v3 + le32(p + 8) * XXH_P2, 13) * XXH_P1;
            v4 = rotl32(v4 + le32(p + 12) * XXH_P2, 13) * XXH_P1;
            p += 16;
        } while (end - p >= 16);
        h = rotl32(v1, 1) + rotl32(v2, 7) + rotl32(v3, 12) + rotl32(v4, 18);
    }
    else
        h = XXH_P5;
    h += (uint32_t)len;
    while (end - p >= 4) {
        h = rotl32(h + le32(p) * XXH_P3, 17) * XXH_P4;
        p += 4;
    }
    while (p < end) {
        h = rotl32(h + (uint32_t)(*p) * XXH_P5, 11) * XXH_P1;
        p++;
    }
    h ^= h >> 15;
    h *= XXH_P2;
    h ^= h >> 13;
    h *= XXH_P3;
    h ^= h >> 16;
    return h;
}

#define LZ4_MAX_OUTPUT ((Py_ssize_t)INT32_MAX)   /* codecs.MAX_OUTPUT */

/* Decode one magic 2 LZ4 frame into a buffer from `allocate`, each block through `into`
 * (cramjam.lz4.decompress_block_into). Accepts a subset of what codecs._lz4_decompress
 * accepts (frames with block checksums are left to it): 1 done (x holds the output), 0 not for
 * this path or corrupt, -1 error. */
static int
lz4_frame_into(const uint8_t *v, Py_ssize_t n, PyObject *allocate, PyObject *into, Item *x)
{
    if (n < 6 || v[0] != 0x04 || v[1] != 0x22 || v[2] != 0x4d || v[3] != 0x18)
        return 0;
    int flg = v[4], bd = v[5];
    if ((flg & 0x03) || !(flg & 0x20) || (flg >> 6) != 1 || (flg & 0x10))
        return 0;
    if ((bd & 0x8F) || ((bd >> 4) & 7) < 4)
        return 0;
    Py_ssize_t max_block = (Py_ssize_t)1 << (2 * ((bd >> 4) & 7) + 8);
    Py_ssize_t pos = (flg & 0x08) ? 14 : 6;
    if (pos >= n || v[pos] != ((xxh32(v + 4, pos - 4) >> 8) & 0xFF))
        return 0;
    pos++;
    /* first walk: where the blocks are and how much they can decode to */
    Py_ssize_t capacity = 0, walk = pos;
    for (;;) {
        if (n - walk < 4)
            return 0;
        uint32_t word = le32(v + walk);
        walk += 4;
        Py_ssize_t size = (Py_ssize_t)(word & 0x7FFFFFFFu);
        if (size == 0) {
            if ((flg & 0x04) && n - walk < 4)
                return 0;
            break;
        }
        if (size > max_block || n - walk < size)
            return 0;
        Py_ssize_t bound = (word & 0x80000000u) ? size : 255 * size + 64;
        capacity += bound < max_block ? bound : max_block;
        if (capacity > LZ4_MAX_OUTPUT + 1)
            capacity = LZ4_MAX_OUTPUT + 1;
        walk += size;
    }
    PyObject *out = PyObject_CallFunction(allocate, "n", capacity);
    if (out == NULL)
        return -1;
    Py_buffer ob;
    if (PyObject_GetBuffer(out, &ob, PyBUF_WRITABLE) < 0) {
        Py_DECREF(out);
        return -1;
    }
    Py_ssize_t total = 0;
    int rc = 1;
    for (;;) {
        uint32_t word = le32(v + pos);
        pos += 4;
        Py_ssize_t size = (Py_ssize_t)(word & 0x7FFFFFFFu);
        if (size == 0)
            break;
        Py_ssize_t room = ob.len - total;
        if (room > max_block)
            room = max_block;
        if (word & 0x80000000u) {
            if (size > room) {
                rc = 0;
                break;
            }
            memcpy((uint8_t *)ob.buf + total, v + pos, (size_t)size);
            total += size;
        }
        else {
            PyObject *src = PyMemoryView_FromMemory((char *)v + pos, size, PyBUF_READ);
            PyObject *dst = src ? PyMemoryView_FromMemory((char *)ob.buf + total, room,
                                                          PyBUF_WRITE) : NULL;
            PyObject *got = dst ? PyObject_CallFunction(into, "OOn", src, dst, room) : NULL;
            Py_XDECREF(src);
            Py_XDECREF(dst);
            if (got == NULL) {
                /* cramjam's DecompressionError: corrupt data, declined; anything else raises */
                PyObject *type = PyErr_Occurred();
                if (type != NULL && (PyErr_GivenExceptionMatches(type, PyExc_MemoryError) ||
                                     PyErr_GivenExceptionMatches(type, PyExc_KeyboardInterrupt))) {
                    rc = -1;
                    break;
                }
                PyErr_Clear();
                rc = 0;
                break;
            }
            Py_ssize_t written = PyLong_AsSsize_t(got);
            Py_DECREF(got);
            if (written < 0 || written > room) {
                if (PyErr_Occurred())
                    PyErr_Clear();
                rc = 0;
                break;
            }
            total += written;
        }
        pos += size;
    }
    if (rc == 1 && total > LZ4_MAX_OUTPUT)
        rc = 0;
    if (rc == 1) {
        x->view = ob;   /* keeps `out` alive */
        x->has_view = 1;
        x->ptr = (const uint8_t *)ob.buf;
        x->len = total;
    }
    else
        PyBuffer_Release(&ob);
    Py_DECREF(out);
    return rc;
}

const char kafkalog_scan_run_arrow_doc[] = (
"scan_run_arrow(buf, with_headers, allocate, crc32c, decompress, lz4_into)\n--\n\n"
"Walk the whole entries of a chunk of a log (a partial one at the end is left, as\n"
"decode_columns leaves it), check each batch's CRC with ``crc32c(view)``, skip control batches,\n"
"decompress with ``decompress(codec, view)`` (any buffer; a KafkaLogError means corruption),\n"
"or, for LZ4 when ``lz4_into`` (cramjam.lz4.decompress_block_into) is given, walk the frame here\n"
"and decompress each block straight into a buffer from ``allocate``, and\n"
"decode all records into exactly sized Arrow buffers. Any entry that is not a well-formed magic 2 batch\n"
"makes it return None, so that the caller's general decoder gives the rows or the error.\n"
ARROW_RESULT_DOC);

PyObject *
kafkalog_scan_run_arrow(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer buf;
    PyObject *allocate, *crc_fn, *decompress, *lz4_into;
    int with_headers;
    if (!PyArg_ParseTuple(args, "y*pOOOO:scan_run_arrow", &buf, &with_headers, &allocate,
                          &crc_fn, &decompress, &lz4_into))
        return NULL;
    const uint8_t *b = (const uint8_t *)buf.buf;
    Py_ssize_t end = buf.len, pos = 0, n = 0, cap = 16;
    Item *it = (Item *)calloc((size_t)cap, sizeof(Item));
    PyObject *result = NULL;
    if (it == NULL) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    /* The entry walk of format/batch.py's EntryScan / scan_entries (docs/format.md §2),
     * inlined; layout from _batch_layout.h. It must be at least as strict as the general one:
     * anything that is not a whole, valid magic 2 batch declines, and decode_columns then gives
     * the rows or the error. (The offset rule is the caller's: range_reader walks each chunk
     * with batch.scan_offsets before decoding it.) */
    while (pos + HEADER_SIZE_UP_TO_MAGIC < end) {
        const uint8_t *h = b + pos;
        int32_t length = be32(h + LENGTH_OFFSET);
        if (h[MAGIC_OFFSET] != 2 || length < RECORD_OVERHEAD_V0)
            goto decline;
        if (pos + LOG_OVERHEAD + (Py_ssize_t)length > end)
            break;   /* a partial entry at the end */
        Py_ssize_t size = LOG_OVERHEAD + (Py_ssize_t)length;
        if (size < V2_HEADER_SIZE)
            goto decline;
        uint32_t stored = (uint32_t)be32(h + CRC_OFFSET);
        int ok = crc_matches(crc_fn, h + V2_CRC_START, size - V2_CRC_START, stored);
        if (ok < 0)
            goto fail;
        if (!ok)
            goto decline;
        int attrs = ((int)h[ATTRIBUTES_OFFSET] << 8) | h[ATTRIBUTES_OFFSET + 1];
        int32_t count = be32(h + RECORDS_COUNT_OFFSET);
        pos += size;
        if (attrs & 0x20)
            continue;   /* a control batch: never returned */
        if (count < 0)
            goto decline;
        if (n == cap) {
            Item *more = (Item *)realloc(it, (size_t)cap * 2 * sizeof(Item));
            if (more == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            memset(more + cap, 0, (size_t)cap * sizeof(Item));
            it = more;
            cap *= 2;
        }
        Item *x = &it[n];
        x->count = count;
        x->base_offset = be64(h + BASE_OFFSET_OFFSET);
        x->base_ts = be64(h + BASE_TIMESTAMP_OFFSET);
        x->max_ts = be64(h + MAX_TIMESTAMP_OFFSET);
        x->ts_type = (attrs >> 3) & 1;
        int codec = attrs & 7;
        if (codec == 0) {
            x->ptr = h + V2_HEADER_SIZE;
            x->len = size - V2_HEADER_SIZE;
        }
        else if (codec == 3 && lz4_into != Py_None) {
            int rc = lz4_frame_into(h + V2_HEADER_SIZE, size - V2_HEADER_SIZE, allocate,
                                    lz4_into, x);
            if (rc < 0)
                goto fail;
            if (rc == 0)
                goto decline;
        }
        else {
            PyObject *view = PyMemoryView_FromMemory((char *)h + V2_HEADER_SIZE,
                                                     size - V2_HEADER_SIZE, PyBUF_READ);
            if (view == NULL)
                goto fail;
            PyObject *out = PyObject_CallFunction(decompress, "iO", codec, view);
            Py_DECREF(view);
            if (out == NULL) {
                if (!PyErr_ExceptionMatches(kafkalog_KafkaLogError))
                    goto fail;   /* not the data's fault (memory, interrupts): propagate */
                PyErr_Clear();   /* the general decoder raises it again, with its position */
                goto decline;
            }
            int rc = PyObject_GetBuffer(out, &x->view, PyBUF_SIMPLE);
            Py_DECREF(out);   /* the view keeps the exporter alive */
            if (rc < 0)
                goto fail;
            x->has_view = 1;
            x->ptr = (const uint8_t *)x->view.buf;
            x->len = x->view.len;
        }
        n++;
    }
    result = arrow_from_items(it, n, with_headers, allocate);
    goto done;
decline:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    items_free(it, cap);   /* zeroed past n: only held views are released */
    PyBuffer_Release(&buf);
    return result;
}
