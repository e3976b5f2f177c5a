/*
 * The magic 2 record parser shared by _columnar_accel.c (scan_v2: records into a Columns) and
 * _columnar_arrow.c (scan_run_arrow: a chunk of a log into Spark's Arrow layout).
 *
 * Every length and count comes from untrusted bytes; the rules are those of
 * pyspark_kafkalog/format/_columnar_py.py:scan_v2, error for error. Static functions only:
 * each translation unit that includes this gets its own copy.
 */
#ifndef KAFKALOG_COLUMNAR_PARSE_H
#define KAFKALOG_COLUMNAR_PARSE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static inline void
rows_free(Rows *r)
{
    free(r->offset); free(r->timestamp); free(r->kstart); free(r->klen);
    free(r->vstart); free(r->vlen); free(r->hcount);
}

static inline void
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


#endif  /* KAFKALOG_COLUMNAR_PARSE_H */
