/* psd.Client's row calls (ext.h): one table's rows (pull_rows, push_rows)
 * or many tables' in one run (pull_rows_many, push_rows_many). Each takes
 * its ids and rows with the buffer protocol (no copy: a pull writes the
 * caller's arrays), releases the GIL for the call, and raises naming the
 * table. */
#include "ext.h"

#include <string.h>

/* Runs expr with the GIL released and the client's lock held; sets rc. */
#define NET_CALL(self, rc, expr)                                               \
  do {                                                                         \
    Py_BEGIN_ALLOW_THREADS(rc) = (expr);                                       \
    Py_END_ALLOW_THREADS                                                       \
  } while (0)

/* Whether a buffer's format is an 8-byte integer. */
static int is_u64(const Py_buffer *v) {
  const char *f = v->format ? v->format : "B";
  if (*f == '<' || *f == '=' || *f == '@')
    f++;
  return v->itemsize == 8 && strlen(f) == 1 && strchr("qQlL", *f);
}

/* Takes a table's ids (1-D 8-byte integers) and its rows buffer (n x dim
 * float32, writable for a pull). Returns 0 or -1 with ValueError. */
static int rows_take(struct pyclient *self, const char *table, PyObject *ids,
                     PyObject *rows, int writable, Py_buffer *iv,
                     Py_buffer *rv) {
  int dim = psc_table_dim(self->c, table);
  if (dim < 0) {
    PyErr_Format(PyExc_KeyError, "table '%s' was not declared", table);
    return -1;
  }
  if (PyObject_GetBuffer(ids, iv, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
    return -1;
  if (!is_u64(iv)) {
    PyErr_Format(PyExc_ValueError,
                 "table '%s': ids of format '%s'; expected 8-byte integers "
                 "(np.uint64)",
                 table, iv->format ? iv->format : "B");
    PyBuffer_Release(iv);
    return -1;
  }
  Py_ssize_t n = iv->len / 8;
  int flags =
      PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(rows, rv, flags) < 0) {
    PyBuffer_Release(iv);
    return -1;
  }
  const char *f = rv->format ? rv->format : "B";
  if (*f == '<' || *f == '=' || *f == '@')
    f++;
  if (strcmp(f, "f") || rv->len != n * dim * 4) {
    PyErr_Format(PyExc_ValueError,
                 "table '%s': rows buffer of %zd bytes, format '%s'; expected "
                 "(%zd, %d) float32 for %zd ids; nothing was sent",
                 table, rv->len, rv->format ? rv->format : "B", n, dim, n);
    PyBuffer_Release(iv);
    PyBuffer_Release(rv);
    return -1;
  }
  return 0;
}

PyObject *pyx_pull_rows(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"table", "ids", "out", "min_version", NULL};
  const char *table;
  PyObject *ids, *out;
  unsigned long long min_version = 0;
  Py_buffer iv, rv;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sOO|K", kwlist, &table, &ids,
                                   &out, &min_version))
    return NULL;
  if (pyx_enter(self))
    return NULL;
  if (rows_take(self, table, ids, out, 1, &iv, &rv)) {
    pyx_leave(self);
    return NULL;
  }
  NET_CALL(self, rc,
           psc_pull_rows(self->c, table, iv.buf, (size_t)(iv.len / 8), rv.buf,
                         min_version));
  rc = pyx_leave_call(self, rc);
  PyBuffer_Release(&iv);
  PyBuffer_Release(&rv);
  if (rc)
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_push_rows(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"table", "ids", "grads", "step", NULL};
  const char *table;
  PyObject *ids, *grads;
  unsigned long long step = 0;
  Py_buffer iv, rv;
  int rc, closed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sOO|K", kwlist, &table, &ids,
                                   &grads, &step))
    return NULL;
  if (pyx_enter(self))
    return NULL;
  if (rows_take(self, table, ids, grads, 0, &iv, &rv)) {
    pyx_leave(self);
    return NULL;
  }
  NET_CALL(self, rc,
           psc_push_rows(self->c, table, iv.buf, (size_t)(iv.len / 8), rv.buf,
                         step, &closed));
  rc = pyx_leave_call(self, rc);
  PyBuffer_Release(&iv);
  PyBuffer_Release(&rv);
  if (rc)
    return NULL;
  return PyBool_FromLong(closed);
}

/* A multi-table call's arguments: each table's name, ids and rows. */
struct many {
  PyObject *tables;    /* owned: the table names, a tuple */
  struct psc_rows *r;  /* owned (PyMem): one per table */
  Py_buffer *iv, *rv;  /* owned (PyMem): each table's ids and rows */
  Py_ssize_t n, taken; /* tables; buffers held so far */
};

static void many_free(struct many *m) {
  for (Py_ssize_t i = 0; i < m->taken; i++) {
    PyBuffer_Release(&m->iv[i]);
    PyBuffer_Release(&m->rv[i]);
  }
  PyMem_Free(m->r);
  PyMem_Free(m->iv);
  PyMem_Free(m->rv);
  Py_XDECREF(m->tables);
}

/* Takes tables (a sequence of str), ids and rows (sequences as long): the
 * buffers of each as rows_take. Returns 0, or -1 with an exception naming
 * the table (m freed). */
static int many_take(struct pyclient *self, PyObject *tables, PyObject *ids,
                     PyObject *rows, int writable, struct many *m) {
  PyObject *it = NULL, *rt = NULL;
  memset(m, 0, sizeof *m);
  if (!(m->tables = PySequence_Tuple(tables)) ||
      !(it = PySequence_Tuple(ids)) || !(rt = PySequence_Tuple(rows)))
    goto fail;
  m->n = PyTuple_GET_SIZE(m->tables);
  if (PyTuple_GET_SIZE(it) != m->n || PyTuple_GET_SIZE(rt) != m->n) {
    PyErr_Format(PyExc_ValueError,
                 "%zd tables, %zd ids and %zd %s; expected one of each per "
                 "table",
                 m->n, PyTuple_GET_SIZE(it), PyTuple_GET_SIZE(rt),
                 writable ? "outs" : "grads");
    goto fail;
  }
  m->r = PyMem_Calloc((size_t)m->n + 1, sizeof *m->r);
  m->iv = PyMem_Calloc((size_t)m->n + 1, sizeof *m->iv);
  m->rv = PyMem_Calloc((size_t)m->n + 1, sizeof *m->rv);
  if (!m->r || !m->iv || !m->rv) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < m->n; i++) {
    PyObject *t = PyTuple_GET_ITEM(m->tables, i);
    const char *name = PyUnicode_Check(t) ? PyUnicode_AsUTF8(t) : NULL;
    if (!name) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "table %zd is a %s; expected a str", i,
                     Py_TYPE(t)->tp_name);
      goto fail;
    }
    if (rows_take(self, name, PyTuple_GET_ITEM(it, i), PyTuple_GET_ITEM(rt, i),
                  writable, &m->iv[i], &m->rv[i]))
      goto fail;
    m->taken++;
    m->r[i].table = name; /* lives as long as m->tables */
    m->r[i].ids = m->iv[i].buf;
    m->r[i].n = (size_t)(m->iv[i].len / 8);
    if (writable)
      m->r[i].rows = m->rv[i].buf;
    else
      m->r[i].grads = m->rv[i].buf;
  }
  Py_DECREF(it);
  Py_DECREF(rt);
  return 0;
fail:
  Py_XDECREF(it);
  Py_XDECREF(rt);
  many_free(m);
  return -1;
}

PyObject *pyx_pull_rows_many(struct pyclient *self, PyObject *args,
                             PyObject *kw) {
  static char *kwlist[] = {"tables", "ids", "outs", "min_version", NULL};
  PyObject *tables, *ids, *outs;
  unsigned long long min_version = 0;
  struct many m;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|K", kwlist, &tables, &ids,
                                   &outs, &min_version))
    return NULL;
  if (pyx_enter(self))
    return NULL;
  if (many_take(self, tables, ids, outs, 1, &m)) {
    pyx_leave(self);
    return NULL;
  }
  NET_CALL(self, rc, psc_pull_rows_many(self->c, m.r, (int)m.n, min_version));
  rc = pyx_leave_call(self, rc);
  many_free(&m);
  if (rc)
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_push_rows_many(struct pyclient *self, PyObject *args,
                             PyObject *kw) {
  static char *kwlist[] = {"tables", "ids", "grads", "step", NULL};
  PyObject *tables, *ids, *grads;
  unsigned long long step = 0;
  struct many m;
  int rc, closed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|K", kwlist, &tables, &ids,
                                   &grads, &step))
    return NULL;
  if (pyx_enter(self))
    return NULL;
  if (many_take(self, tables, ids, grads, 0, &m)) {
    pyx_leave(self);
    return NULL;
  }
  NET_CALL(self, rc, psc_push_rows_many(self->c, m.r, (int)m.n, step, &closed));
  rc = pyx_leave_call(self, rc);
  many_free(&m);
  if (rc)
    return NULL;
  return PyBool_FromLong(closed);
}
