/*
 * Output buffers for the C extensions, from a Python `allocate(n)` callable: the callers pass
 * pyarrow.allocate_buffer, so large outputs come from Arrow's memory pool, which keeps its pages
 * (fresh memory from malloc is page-faulted in again for every chunk, which cost as much as the
 * decoding or encoding itself).
 */
#ifndef KAFKALOG_POOL_H
#define KAFKALOG_POOL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A writable buffer of `size` bytes; NULL with an exception set on failure (then *obj may still
 * need a DECREF, *view is not held). */
static inline uint8_t *
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

#endif  /* KAFKALOG_POOL_H */
