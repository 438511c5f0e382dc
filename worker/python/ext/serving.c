/* psd.Serving's C half (ext.h): a client of a job's serving tasks
 * (psc_serving, psd/client.h). lookup and dense take the caller's numpy
 * buffers with the buffer protocol (the rows land in them straight from
 * the wire), release the GIL for the call and poll for Ctrl-C; the psd
 * package's Serving (psd/serving.py) allocates them and shapes the
 * results. */
#include "ext.h"

#include <string.h>

/* A _psd.Serving. */
struct pyserving {
  PyObject_HEAD psc_serving *s; /* owned; NULL once closed */
  PyThread_type_lock lock;      /* one call at a time */
};

/* psd.Error from the serving client's last error. */
static PyObject *raise_serving(psc_serving *s, int rc) {
  const char *msg =
      s && psc_serving_error(s)[0] ? psc_serving_error(s) : psc_strerror(rc);
  return pyx_raise_text(msg, rc, s ? psc_serving_grpc_status(s) : 0);
}

static PyObject *serving_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  struct pyserving *self = (struct pyserving *)type->tp_alloc(type, 0);
  if (!self)
    return NULL;
  if (!(self->lock = PyThread_allocate_lock())) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return (PyObject *)self;
}

/* Serving(spec, replica=-1, name=None, timeout_ms=0, retry_s=0.0). */
static int serving_init(struct pyserving *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"spec",       "replica", "name",
                           "timeout_ms", "retry_s", NULL};
  PyObject *path = NULL;
  const char *name = NULL;
  int replica = -1, timeout_ms = 0, rc;
  double retry_s = 0;
  char err[8192] = "";
  psc_serving *s = NULL;
  struct psc_serving_options o;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|izid", kwlist,
                                   PyUnicode_FSConverter, &path, &replica,
                                   &name, &timeout_ms, &retry_s))
    return -1;
  if (self->s) {
    Py_DECREF(path);
    PyErr_SetString(PyExc_RuntimeError, "psd.Serving is open already");
    return -1;
  }
  psc_serving_options_init(&o);
  o.replica = replica;
  o.name = name;
  o.timeout_ms = timeout_ms;
  o.retry_s = retry_s;
  const char *p = PyBytes_AS_STRING(path);
  Py_BEGIN_ALLOW_THREADS rc = psc_serving_open(&s, p, &o, err, sizeof err);
  Py_END_ALLOW_THREADS Py_DECREF(path);
  if (rc) {
    pyx_raise_text(err[0] ? err : psc_strerror(rc), rc, 0);
    return -1;
  }
  psc_serving_set_interrupt(s, pyx_interrupted, NULL);
  self->s = s;
  return 0;
}

static void close_serving(struct pyserving *self) {
  psc_serving *s = self->s;
  if (!s)
    return;
  self->s = NULL;
  Py_BEGIN_ALLOW_THREADS psc_serving_close(s);
  Py_END_ALLOW_THREADS
}

static void serving_dealloc(struct pyserving *self) {
  close_serving(self);
  if (self->lock)
    PyThread_free_lock(self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *serving_close(struct pyserving *self, PyObject *unused) {
  PyThread_type_lock lock = self->lock;
  if (self->s) {
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS close_serving(self);
    PyThread_release_lock(lock);
  }
  Py_RETURN_NONE;
}

/* Takes the lock with the GIL released; -1 (RuntimeError) when closed. */
static int enter(struct pyserving *self) {
  PyThread_type_lock lock = self->lock;
  if (!PyThread_acquire_lock(lock, NOWAIT_LOCK)) {
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
  }
  if (!self->s) {
    PyThread_release_lock(lock);
    PyErr_SetString(PyExc_RuntimeError, "psd.Serving is closed");
    return -1;
  }
  return 0;
}

/* Ends a call that returned rc: psd.Error (or the signal handler's
 * exception) before the lock goes. Returns 0 or -1. */
static int leave(struct pyserving *self, int rc) {
  if (rc && !PyErr_Occurred())
    raise_serving(self->s, rc);
  PyThread_release_lock(self->lock);
  return rc ? -1 : 0;
}

/* Room for n shards' versions (zeroed; PyMem_Free it), or NULL with
 * MemoryError raised and *rc PSC_ENOMEM. */
static uint64_t *versions_new(int n, int *rc) {
  uint64_t *v = PyMem_Calloc((size_t)n + 1, sizeof *v);
  if (!v) {
    PyErr_NoMemory();
    *rc = PSC_ENOMEM;
  }
  return v;
}

/* A tuple of the shards' versions. */
static PyObject *versions_tuple(const uint64_t *v, int n) {
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t && i < n; i++) {
    PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
    if (!x) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, x);
  }
  return t;
}

/* Takes obj as a C-contiguous writable buffer of exactly len bytes whose
 * format is fmt ("f" or "?"/"B"); -1 with ValueError naming what. */
static int take(PyObject *obj, Py_buffer *v, Py_ssize_t len, const char *fmts,
                const char *what) {
  const char *f;
  if (PyObject_GetBuffer(
          obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
    return -1;
  f = v->format ? v->format : "B";
  if (*f == '<' || *f == '=' || *f == '@')
    f++;
  if (strlen(f) != 1 || !strchr(fmts, *f) || v->len != len) {
    PyErr_Format(PyExc_ValueError,
                 "%s: a buffer of %zd bytes, format '%s'; expected %zd bytes "
                 "of format '%s'",
                 what, v->len, v->format ? v->format : "B", len, fmts);
    PyBuffer_Release(v);
    return -1;
  }
  return 0;
}

/* dim(table) -> the table's floats per row. */
static PyObject *serving_dim(struct pyserving *self, PyObject *args) {
  const char *table;
  int rc;
  if (!PyArg_ParseTuple(args, "s", &table) || enter(self))
    return NULL;
  Py_BEGIN_ALLOW_THREADS rc = psc_lookup_dim(self->s, table);
  Py_END_ALLOW_THREADS if (leave(self, rc < 0 ? rc : 0)) return NULL;
  return PyLong_FromLong(rc);
}

/* lookup(table, ids, rows, found) -> versions: ids a uint64 buffer, rows
 * (n, dim) float32 and found n bytes, both written. */
static PyObject *serving_lookup(struct pyserving *self, PyObject *args) {
  const char *table;
  PyObject *ids, *rows, *found;
  Py_buffer iv, rv, fv;
  uint64_t *versions = NULL;
  PyObject *ret = NULL;
  int rc, dim, n;
  if (!PyArg_ParseTuple(args, "sOOO", &table, &ids, &rows, &found) ||
      enter(self))
    return NULL;
  n = psc_serving_shards(self->s);
  Py_BEGIN_ALLOW_THREADS dim = psc_lookup_dim(self->s, table);
  Py_END_ALLOW_THREADS if (dim < 0) {
    leave(self, dim);
    return NULL;
  }
  if (PyObject_GetBuffer(ids, &iv, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
    leave(self, 0);
    return NULL;
  }
  if (iv.itemsize != 8) {
    PyErr_Format(PyExc_ValueError,
                 "table '%s': ids of %zd-byte items; expected uint64", table,
                 iv.itemsize);
    PyBuffer_Release(&iv);
    leave(self, 0);
    return NULL;
  }
  if (take(rows, &rv, iv.len / 8 * dim * 4, "f", "rows")) {
    PyBuffer_Release(&iv);
    leave(self, 0);
    return NULL;
  }
  if (take(found, &fv, iv.len / 8, "?Bb", "found")) {
    PyBuffer_Release(&iv);
    PyBuffer_Release(&rv);
    leave(self, 0);
    return NULL;
  }
  if ((versions = versions_new(n, &rc))) {
    Py_BEGIN_ALLOW_THREADS rc = psc_lookup(
        self->s, table, iv.buf, (size_t)(iv.len / 8), rv.buf, fv.buf, versions);
    Py_END_ALLOW_THREADS
  }
  if (!leave(self, rc))
    ret = versions_tuple(versions, n);
  PyMem_Free(versions);
  PyBuffer_Release(&iv);
  PyBuffer_Release(&rv);
  PyBuffer_Release(&fv);
  return ret;
}

/* dense(name, out=None) -> (numel, versions): out None asks for the size
 * alone; else a float32 buffer of exactly numel elements, written. */
static PyObject *serving_dense(struct pyserving *self, PyObject *args) {
  const char *name;
  PyObject *out = Py_None, *ret = NULL;
  Py_buffer ov = {0};
  uint64_t *versions;
  size_t numel = 0;
  int rc, n;
  if (!PyArg_ParseTuple(args, "s|O", &name, &out) || enter(self))
    return NULL;
  n = psc_serving_shards(self->s);
  if (out != Py_None) {
    if (PyObject_GetBuffer(
            out, &ov, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
      leave(self, 0);
      return NULL;
    }
  }
  if ((versions = versions_new(n, &rc))) {
    float *dst = out != Py_None ? ov.buf : NULL;
    size_t count = out != Py_None ? (size_t)ov.len / 4 : 0;
    Py_BEGIN_ALLOW_THREADS rc =
        psc_lookup_dense(self->s, name, dst, count, &numel, versions);
    Py_END_ALLOW_THREADS
  }
  if (!leave(self, rc)) {
    PyObject *v = versions_tuple(versions, n);
    ret = v ? Py_BuildValue("(nN)", (Py_ssize_t)numel, v) : NULL;
  }
  PyMem_Free(versions);
  if (out != Py_None)
    PyBuffer_Release(&ov);
  return ret;
}

static PyObject *serving_task(struct pyserving *self, PyObject *args) {
  int shard, t;
  if (!PyArg_ParseTuple(args, "i", &shard))
    return NULL;
  if (!self->s) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Serving is closed");
    return NULL;
  }
  if ((t = psc_serving_task(self->s, shard)) < 0) {
    PyErr_Format(PyExc_IndexError, "no shard %d; the job has %d", shard,
                 psc_serving_shards(self->s));
    return NULL;
  }
  return PyLong_FromLong(t);
}

static PyObject *get_info(struct pyserving *self, void *what) {
  if (!self->s) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Serving is closed");
    return NULL;
  }
  return PyLong_FromLong(!strcmp(what, "shards")
                             ? psc_serving_shards(self->s)
                             : psc_serving_replicas(self->s));
}

static PyGetSetDef serving_getset[] = {
    {"shards", (getter)get_info, NULL, "training shards (nps)", "shards"},
    {"replicas", (getter)get_info, NULL, "serving replicas per shard",
     "replicas"},
    {NULL}};

static PyMethodDef serving_methods[] = {
    {"dim", (PyCFunction)serving_dim, METH_VARARGS,
     "dim(table) -> the table's floats per row"},
    {"lookup", (PyCFunction)serving_lookup, METH_VARARGS,
     "lookup(table, ids, rows, found) -> versions per shard"},
    {"dense", (PyCFunction)serving_dense, METH_VARARGS,
     "dense(name, out=None) -> (numel, versions per shard)"},
    {"task", (PyCFunction)serving_task, METH_VARARGS,
     "task(shard) -> J of the serve:J its lookups go to now"},
    {"close", (PyCFunction)serving_close, METH_NOARGS,
     "close(): closes the channels"},
    {NULL}};

PyTypeObject pyx_serving_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "psd._psd.Serving",
    .tp_doc = "A client of a psd job's serving tasks (psc_serving).",
    .tp_basicsize = sizeof(struct pyserving),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = serving_new,
    .tp_init = (initproc)serving_init,
    .tp_dealloc = (destructor)serving_dealloc,
    .tp_methods = serving_methods,
    .tp_getset = serving_getset,
};
