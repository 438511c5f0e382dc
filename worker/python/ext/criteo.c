/* _psd.CriteoReader: worker/data/criteo.c's reader of Criteo's TSV for
 * psd.criteo (psd/criteo.py). read_into(dense, sparse, labels) fills
 * caller-owned buffers (float32 [B, 13], int64 [B, 26], float32 [B], taken
 * with the buffer protocol: numpy arrays, no numpy C API) with the next
 * examples of the reader's share and returns how many; 0 at the end. The
 * GIL is released while it reads and parses; a lock keeps one read at a
 * time per reader. A mistake in the file raises ValueError, a missing file
 * FileNotFoundError, a read error OSError, each naming the file (and the
 * line). */
#include "ext.h"

#include <stdint.h>
#include <string.h>

#include "criteo.h"
#include "err.h"

/* A reader. */
struct pycriteo {
  PyObject_HEAD struct dw_criteo *r; /* owned; NULL once closed */
  PyThread_type_lock lock;           /* one read at a time */
  uint64_t bounds[DW_CRITEO_CATS];   /* ids % bounds[f] */
  int bounded;                       /* whether bounds apply */
};

/* Raises the exception for reader code rc with message msg. */
static PyObject *raise_rc(int rc, const char *msg) {
  PyObject *type = rc == CM_EFORMAT || rc == CM_EINVAL ? PyExc_ValueError
                   : rc == CM_ENOENT                   ? PyExc_FileNotFoundError
                   : rc == CM_ENOMEM                   ? PyExc_MemoryError
                                                       : PyExc_OSError;
  PyErr_SetString(type, msg);
  return NULL;
}

static int pycriteo_init(struct pycriteo *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "bounds", "share", "nshares", NULL};
  PyObject *path = NULL, *bounds = Py_None;
  int share = 0, nshares = 1, rc;
  char err[1400];
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|Oii", kwlist,
                                   PyUnicode_FSConverter, &path, &bounds,
                                   &share, &nshares))
    return -1;
  if (self->r) {
    Py_DECREF(path);
    PyErr_SetString(PyExc_RuntimeError, "CriteoReader is open already");
    return -1;
  }
  self->bounded = bounds != Py_None;
  if (self->bounded) {
    PyObject *seq = PySequence_Fast(bounds, "bounds: a list of 26 ints");
    if (!seq || PySequence_Fast_GET_SIZE(seq) != DW_CRITEO_CATS) {
      if (seq)
        PyErr_Format(PyExc_ValueError, "bounds: %zd values, want 26",
                     PySequence_Fast_GET_SIZE(seq));
      Py_XDECREF(seq);
      Py_DECREF(path);
      return -1;
    }
    for (int f = 0; f < DW_CRITEO_CATS; f++) {
      unsigned long long b =
          PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, f));
      if (PyErr_Occurred() || b == 0 || b > (1ull << 63)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "bounds[%d]: want a whole number in 1..2^63", f);
        Py_DECREF(seq);
        Py_DECREF(path);
        return -1;
      }
      self->bounds[f] = b;
    }
    Py_DECREF(seq);
  }
  if (!self->lock && !(self->lock = PyThread_allocate_lock())) {
    Py_DECREF(path);
    PyErr_NoMemory();
    return -1;
  }
  Py_BEGIN_ALLOW_THREADS rc = dw_criteo_open(
      PyBytes_AS_STRING(path), share, nshares, &self->r, err, sizeof err);
  Py_END_ALLOW_THREADS Py_DECREF(path);
  if (rc) {
    raise_rc(rc, err);
    return -1;
  }
  return 0;
}

/* Takes obj as a writable C-contiguous buffer of at least need bytes with
 * items of itemsize bytes; raises ValueError naming it when not. */
static int take(PyObject *obj, const char *name, Py_ssize_t itemsize,
                Py_ssize_t per, Py_buffer *view) {
  const char *fmt;
  if (PyObject_GetBuffer(
          obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
    return -1;
  fmt = view->format ? view->format : "B";
  if (*fmt == '<' || *fmt == '=' || *fmt == '@')
    fmt++;
  if (view->itemsize != itemsize || view->len % (itemsize * per) ||
      !strchr(itemsize == 4 ? "f" : "qQlL", *fmt) || fmt[1]) {
    PyErr_Format(PyExc_ValueError,
                 "%s: want a C-contiguous %s array, %zd a row; got %zd bytes "
                 "of format '%s'",
                 name, itemsize == 4 ? "float32" : "int64", per, view->len,
                 view->format ? view->format : "B");
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

static PyObject *pycriteo_read_into(struct pycriteo *self, PyObject *args) {
  PyObject *od, *os, *ol, *ret = NULL;
  Py_buffer d = {0}, s = {0}, l = {0};
  size_t n, got = 0;
  char err[1400];
  int rc;
  if (!PyArg_ParseTuple(args, "OOO", &od, &os, &ol))
    return NULL;
  if (!self->r)
    return raise_rc(CM_EINVAL, "the CriteoReader is closed");
  if (take(od, "dense", 4, DW_CRITEO_INTS, &d) ||
      take(os, "sparse", 8, DW_CRITEO_CATS, &s) || take(ol, "labels", 4, 1, &l))
    goto out;
  n = (size_t)(l.len / 4);
  if ((size_t)d.len / (4 * DW_CRITEO_INTS) < n ||
      (size_t)s.len / (8 * DW_CRITEO_CATS) < n) {
    PyErr_Format(PyExc_ValueError,
                 "dense, sparse and labels must hold the same examples "
                 "(%zd, %zd, %zd)",
                 d.len / (4 * DW_CRITEO_INTS), s.len / (8 * DW_CRITEO_CATS),
                 l.len / 4);
    goto out;
  }
  Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(self->lock, WAIT_LOCK);
  rc = dw_criteo_read(self->r, n, self->bounded ? self->bounds : NULL, l.buf,
                      d.buf, NULL, s.buf, &got, err, sizeof err);
  PyThread_release_lock(self->lock);
  Py_END_ALLOW_THREADS if (rc) {
    raise_rc(rc, err);
    goto out;
  }
  ret = PyLong_FromSize_t(got);
out:
  if (d.obj)
    PyBuffer_Release(&d);
  if (s.obj)
    PyBuffer_Release(&s);
  if (l.obj)
    PyBuffer_Release(&l);
  return ret;
}

static PyObject *pycriteo_lines(struct pycriteo *self, void *closure) {
  (void)closure;
  return PyLong_FromUnsignedLongLong(self->r ? dw_criteo_lines(self->r) : 0);
}

static PyObject *pycriteo_close(struct pycriteo *self, PyObject *unused) {
  (void)unused;
  if (self->lock) {
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(self->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
  }
  dw_criteo_close(self->r);
  self->r = NULL;
  if (self->lock)
    PyThread_release_lock(self->lock);
  Py_RETURN_NONE;
}

static void pycriteo_dealloc(struct pycriteo *self) {
  dw_criteo_close(self->r);
  if (self->lock)
    PyThread_free_lock(self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef pycriteo_methods[] = {
    {"read_into", (PyCFunction)pycriteo_read_into, METH_VARARGS,
     "read_into(dense, sparse, labels) -> n: the share's next examples into "
     "float32 [B, 13], int64 [B, 26] and float32 [B] buffers; 0 at the end"},
    {"close", (PyCFunction)pycriteo_close, METH_NOARGS, "closes the file"},
    {NULL}};

static PyGetSetDef pycriteo_getset[] = {{"lines", (getter)pycriteo_lines, NULL,
                                         "lines read so far (all shares')",
                                         NULL},
                                        {NULL}};

static PyTypeObject pyx_criteo_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "psd._psd.CriteoReader",
    .tp_basicsize = sizeof(struct pycriteo),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CriteoReader(path, bounds=None, share=0, nshares=1): Criteo's "
              "TSV (plain or gzip), the lines i with i % nshares == share; "
              "use psd.criteo.Criteo",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pycriteo_init,
    .tp_dealloc = (destructor)pycriteo_dealloc,
    .tp_methods = pycriteo_methods,
    .tp_getset = pycriteo_getset,
};

/* Adds CriteoReader and CRITEO_CARDINALITIES (criteo.h's bounds) to the
 * module (module.c calls it). */
int pyx_criteo_add(PyObject *m);
int pyx_criteo_add(PyObject *m) {
  PyObject *card = PyTuple_New(DW_CRITEO_CATS);
  if (!card || PyType_Ready(&pyx_criteo_type) < 0)
    goto fail;
  for (int f = 0; f < DW_CRITEO_CATS; f++) {
    PyObject *v = PyLong_FromUnsignedLongLong(dw_criteo_bounds[f]);
    if (!v)
      goto fail;
    PyTuple_SET_ITEM(card, f, v);
  }
  Py_INCREF(&pyx_criteo_type);
  if (PyModule_AddObject(m, "CriteoReader", (PyObject *)&pyx_criteo_type) < 0) {
    Py_DECREF(&pyx_criteo_type);
    goto fail;
  }
  if (PyModule_AddObject(m, "CRITEO_CARDINALITIES", card) < 0)
    goto fail;
  return 0;
fail:
  Py_XDECREF(card);
  return -1;
}
