/* The sink's accumulator (format/accumulate.py), included once by _encode_accel.c after
 * _encode_common.h. */
#ifndef KAFKALOG_ENCODE_ACCUMULATE_H
#define KAFKALOG_ENCODE_ACCUMULATE_H

#include "_encode_common.h"

/* -- the accumulator: records into per-partition batches as they come ------------------------ */

/* The sink's rows arrive in input batches of every partition mixed. Kafka's producer appends
 * each record to its partition's open batch and closes the batch when it is full; so does this,
 * while the input batch is still in the CPU's caches: each record is written once, into the
 * buffer its batch is sent from, behind `room` bytes for the batch header.
 * The rule that closes a batch is arrow_encode.chunk_bounds's, applied as records come: at
 * most batch_records records and, unless one record is bigger, at most batch_size estimated
 * bytes (the caller's sizes); and, exactly, at most max_bytes bytes of records. All calls hold
 * the GIL, so nothing can change the inputs meanwhile; a buffer's growth calls `allocate`,
 * Python code that could call back in while an open batch's state is cached, so append and
 * drain refuse to be re-entered. */
typedef struct {
    PyObject *obj;            /* the open batch's buffer, NULL: no open batch */
    Py_buffer view;
    int64_t at;               /* where its next record goes */
    int64_t count, base_ts, max_ts, est;
    int64_t last;             /* bytes of the last batch closed here: the next one's first guess */
} Open;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nparts;
    int64_t batch_records, batch_size, max_bytes, room;
    PyObject *allocate;
    Open *open;
    int busy;                 /* in append or drain: `allocate` must not re-enter them */
} Accumulator;

/* A partition's first batch starts small and doubles as it fills (a topic of thousands of
 * partitions must not cost a big buffer per partition up front); later ones start at the size
 * of the partition's previous batch. */
#define FIRST_GUESS ((int64_t)8 << 10)

/* A record's estimated size beyond its key and value: arrow_encode.estimated_sizes's 12. */
#define ESTIMATE_OVERHEAD 12

static void
open_release(Open *o)
{
    if (o->obj != NULL) {
        PyBuffer_Release(&o->view);
        Py_CLEAR(o->obj);
    }
    o->at = o->count = o->est = 0;
}

static void
acc_dealloc(Accumulator *self)
{
    for (Py_ssize_t p = 0; self->open != NULL && p < self->nparts; p++)
        open_release(&self->open[p]);
    free(self->open);
    Py_XDECREF(self->allocate);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
acc_init(Accumulator *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"partitions", "batch_records", "batch_size", "max_bytes", "room",
                             "allocate", NULL};
    Py_ssize_t nparts;
    long long records, size, max_bytes, room;
    PyObject *allocate;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nLLLLO:Accumulator", kwlist, &nparts,
                                     &records, &size, &max_bytes, &room, &allocate))
        return -1;
    if (self->open != NULL) {
        PyErr_SetString(PyExc_TypeError, "an Accumulator is initialised once");
        return -1;
    }
    if (nparts < 1 || nparts > (1 << 24) || records < 1 || size < 1 || max_bytes < 1 ||
        max_bytes > INT32_MAX || room < 0 || room > 4096) {
        PyErr_SetString(PyExc_ValueError,
                        "Accumulator needs 1 <= partitions <= 2**24, batch_records >= 1, "
                        "batch_size >= 1, 1 <= max_bytes < 2**31 and 0 <= room <= 4096");
        return -1;
    }
    self->open = (Open *)calloc((size_t)nparts, sizeof(Open));
    if (self->open == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->nparts = nparts;
    self->batch_records = records;
    self->batch_size = size;
    self->max_bytes = max_bytes;
    self->room = room;
    Py_INCREF(allocate);
    self->allocate = allocate;
    return 0;
}

/* (partition, buffer, end, count, base_timestamp, max_timestamp) onto `out`; the batch's
 * records are buffer[room:end]. */
static int
acc_close(Accumulator *self, Py_ssize_t p, PyObject *out)
{
    Open *o = &self->open[p];
    PyObject *t = Py_BuildValue("nOLLLL", p, o->obj, (long long)o->at, (long long)o->count,
                                (long long)o->base_ts, (long long)o->max_ts);
    if (t == NULL)
        return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    if (rc < 0)
        return -1;
    o->last = o->at;
    open_release(o);
    return 0;
}

/* Room for `need` more bytes in partition p's open batch, opening it if needed. */
static int
acc_reserve(Accumulator *self, Open *o, int64_t need)
{
    int64_t have = o->obj != NULL ? (int64_t)o->view.len : 0;
    if (o->obj != NULL && o->at + need <= have)
        return 0;
    int64_t guess = o->last > 0 ? o->last + o->last / 8 : self->room + FIRST_GUESS;
    int64_t cap = o->obj != NULL ? 2 * have : guess;
    if (cap < o->at + need + (o->obj == NULL ? self->room : 0))
        cap = o->at + need + (o->obj == NULL ? self->room : 0);
    PyObject *obj;
    Py_buffer view;
    uint8_t *buf = take_buffer(self->allocate, (Py_ssize_t)cap, &obj, &view);
    if (buf == NULL) {
        Py_XDECREF(obj);
        return -1;
    }
    if (o->obj != NULL) {
        memcpy(buf, o->view.buf, (size_t)o->at);
        PyBuffer_Release(&o->view);
        Py_DECREF(o->obj);
    } else {
        o->at = self->room;
    }
    o->obj = obj;
    o->view = view;
    return 0;
}

/* 0 and busy, or -1 with RuntimeError when the accumulator is already in a call. */
static int
acc_enter(Accumulator *self)
{
    if (self->open == NULL) {
        PyErr_SetString(PyExc_TypeError, "Accumulator was not initialised");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Accumulator.append and drain cannot be called from its allocate");
        return -1;
    }
    self->busy = 1;
    return 0;
}

PyDoc_STRVAR(acc_append_doc,
"append(key, value, timestamps, hrec, hcount, partitions, sizes)\n--\n\n"
"Appends each row, in order, to the open batch of its partition. The first five arguments\n"
"as for ``encode_v2_records``; ``partitions``: int64, each row's partition (0 up to the\n"
"accumulator's partitions); ``sizes``: int64, each row's estimated size (the batch.size\n"
"rule's), or None without headers for ``arrow_encode.estimated_sizes``'s. Returns the\n"
"batches this closed, as ``(partition, buffer, end, count, base_timestamp,\n"
"max_timestamp)``: the records are ``buffer[room:end]``, byte for byte what\n"
"``encode.encode_batch_v2`` writes after its header. On an error nothing of the call is\n"
"taken back: the caller drops the accumulator.");

static PyObject *
acc_append(Accumulator *self, PyObject *args)
{
    PyObject *key, *value, *ts_obj, *hrec_obj, *hcount_obj, *parts_obj, *sizes_obj;
    if (!PyArg_ParseTuple(args, "OOOOOOO:append", &key, &value, &ts_obj, &hrec_obj, &hcount_obj,
                          &parts_obj, &sizes_obj))
        return NULL;
    if (acc_enter(self) < 0)
        return NULL;
    OpenInput cols;
    memset(&cols, 0, sizeof(cols));
    const Input *in = &cols.in;
    Py_buffer parts_view, sizes_view;
    int have_parts = 0, have_sizes = 0, rc = E_OK;
    PyObject *out = NULL;
    Py_ssize_t n = PyObject_Length(value);
    if (n < 0 || input_open(&cols, key, value, ts_obj, hrec_obj, hcount_obj, n) < 0)
        goto done;
    if (int64_open(parts_obj, "partitions", n, &parts_view) < 0)
        goto done;
    have_parts = 1;
    if (sizes_obj == Py_None && hrec_obj != Py_None) {
        PyErr_SetString(PyExc_ValueError, "sizes are needed with headers");
        goto done;
    }
    if (sizes_obj != Py_None) {
        if (int64_open(sizes_obj, "sizes", n, &sizes_view) < 0)
            goto done;
        have_sizes = 1;
    }
    if ((out = PyList_New(0)) == NULL)
        goto done;
    const uint8_t *parts = (const uint8_t *)parts_view.buf;
    const uint8_t *sizes = have_sizes ? (const uint8_t *)sizes_view.buf : NULL;
    Fields f;
    memset(&f, 0, sizeof(f));
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = ld64(parts + 8 * i), ts = ld64(in->ts + 8 * i), est;
        if (sizes != NULL) {
            est = ld64(sizes + 8 * i);
        } else {   /* arrow_encode.estimated_sizes without headers */
            int64_t at, klen, vlen;
            if ((rc = span(&in->key, i, &at, &klen)) != E_OK ||
                (rc = span(&in->value, i, &at, &vlen)) != E_OK)
                goto fail;
            est = (klen > 0 ? klen : 0) + (vlen > 0 ? vlen : 0) + ESTIMATE_OVERHEAD;
        }
        if (p < 0 || p >= self->nparts) {
            PyErr_Format(PyExc_ValueError, "row %zd has partition %lld, not 0..%zd", i,
                         (long long)p, self->nparts - 1);
            goto fail;
        }
        Open *o = &self->open[p];
        if (o->count > 0) {
            if ((rc = fields_at(in, i, o->base_ts, o->count, &f)) != E_OK)
                goto fail;
            if (o->est + est > self->batch_size || o->at - self->room + f.size > self->max_bytes)
                if (acc_close(self, (Py_ssize_t)p, out) < 0)
                    goto fail;
        }
        if (o->count == 0) {
            if ((rc = fields_at(in, i, ts, 0, &f)) != E_OK)
                goto fail;
            o->base_ts = o->max_ts = ts;
        }
        if (self->room + f.size > INT32_MAX) {
            rc = E_TOO_MANY;
            goto fail;
        }
        if (acc_reserve(self, o, f.size) < 0)
            goto fail;
        put_record((uint8_t *)o->view.buf + o->at, in, &f);
        o->at += f.size;
        o->count++;
        o->est += est;
        if (ts > o->max_ts)
            o->max_ts = ts;
        if (o->count >= self->batch_records || o->est >= self->batch_size)
            if (acc_close(self, (Py_ssize_t)p, out) < 0)
                goto fail;
    }
    goto done;
fail:
    if (rc != E_OK)
        raise_failure(rc);
    Py_CLEAR(out);
done:
    if (have_sizes)
        PyBuffer_Release(&sizes_view);
    if (have_parts)
        PyBuffer_Release(&parts_view);
    input_close(&cols);
    self->busy = 0;
    return out;
}

PyDoc_STRVAR(acc_drain_doc,
"drain()\n--\n\n"
"Closes every open batch, by partition, and returns them as ``append`` does.");

static PyObject *
acc_drain(Accumulator *self, PyObject *Py_UNUSED(ignored))
{
    if (acc_enter(self) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t p = 0; out != NULL && p < self->nparts; p++)
        if (self->open[p].count > 0 && acc_close(self, p, out) < 0)
            Py_CLEAR(out);
    self->busy = 0;
    return out;
}

static PyObject *
acc_pending(Accumulator *self, void *Py_UNUSED(closure))
{
    long long rows = 0;
    for (Py_ssize_t p = 0; self->open != NULL && p < self->nparts; p++)
        rows += self->open[p].count;
    return PyLong_FromLongLong(rows);
}

static PyMethodDef acc_methods[] = {
    {"append", (PyCFunction)acc_append, METH_VARARGS, acc_append_doc},
    {"drain", (PyCFunction)acc_drain, METH_NOARGS, acc_drain_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef acc_getset[] = {
    {"pending", (getter)acc_pending, NULL, "records in open batches", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(acc_doc,
"Accumulator(partitions, batch_records, batch_size, max_bytes, room, allocate)\n--\n\n"
"Magic 2 records appended to one open batch per partition, as Kafka's RecordAccumulator\n"
"does. A batch closes when the next record would make it more than ``batch_records``\n"
"records, more than ``batch_size`` estimated bytes (a single bigger record makes a batch of\n"
"its own) or more than ``max_bytes`` bytes of records; and as soon as it is full. Buffers\n"
"come from ``allocate`` (``pyarrow.allocate_buffer``), each with ``room`` free bytes in front\n"
"for the batch header.");

static PyTypeObject AccumulatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyspark_kafkalog.format._encode_accel.Accumulator",
    .tp_basicsize = sizeof(Accumulator),
    .tp_dealloc = (destructor)acc_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = acc_doc,
    .tp_methods = acc_methods,
    .tp_getset = acc_getset,
    .tp_init = (initproc)acc_init,
    .tp_new = PyType_GenericNew,
};

#endif  /* KAFKALOG_ENCODE_ACCUMULATE_H */
