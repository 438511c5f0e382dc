/* The _psd module (ext.h): psd.Error, the buffer checks, the handle lists,
 * the per-client lock and the Ctrl-C poll. */
#include "ext.h"

#include <string.h>

PyObject *pyx_error;

/* Sets exc.name to value (a new reference, taken). */
static void set_attr(PyObject *exc, const char *name, PyObject *value) {
  if (value) {
    PyObject_SetAttrString(exc, name, value);
    Py_DECREF(value);
  }
}

PyObject *pyx_raise_text(const char *msg, int rc, int st) {
  /* A file name in msg may be bytes that are not UTF-8: \xff for those. */
  PyObject *text =
      PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
  if (!text)
    return NULL;
  PyObject *exc = PyObject_CallOneArg(pyx_error, text);
  Py_DECREF(text);
  if (!exc)
    return NULL;
  set_attr(exc, "code", PyLong_FromLong(rc));
  set_attr(exc, "grpc_status", PyLong_FromLong(st));
  set_attr(exc, "grpc_name", PyUnicode_FromString(psc_grpc_status_name(st)));
  PyErr_SetObject(pyx_error, exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *pyx_raise(psc_client *c, int rc) {
  int st = c ? psc_grpc_status(c) : 0;
  const char *msg = c && psc_error(c)[0] ? psc_error(c) : psc_strerror(rc);
  return pyx_raise_text(msg, rc, st);
}

/* "(3, 4)" for a shape tuple or a Py_buffer's shape, into buf. */
static void shape_text(char *buf, size_t len, const Py_ssize_t *shape,
                       int ndim) {
  size_t at = (size_t)snprintf(buf, len, "(");
  for (int d = 0; d < ndim && at < len; d++)
    at +=
        (size_t)snprintf(buf + at, len - at, "%s%zd", d ? ", " : "", shape[d]);
  if (at < len)
    snprintf(buf + at, len - at, ndim == 1 ? ",)" : ")");
}

/* Whether a buffer's format is one f32 in native order. */
static int is_f32(const char *fmt) {
  if (!fmt)
    return 0; /* the default format is unsigned bytes */
  if (*fmt == '<' || *fmt == '=' || *fmt == '@')
    fmt++;
  return strcmp(fmt, "f") == 0;
}

/* Takes obj as variable h's buffer. Returns 0, or -1 with ValueError. */
static int take_one(struct pyclient *self, PyObject *obj, int h, int writable,
                    Py_buffer *view) {
  PyObject *name = PyList_GetItem(self->names, h);
  PyObject *shape = PyList_GetItem(self->shapes, h);
  const char *vname = name ? PyUnicode_AsUTF8(name) : "?";
  Py_ssize_t want[4] = {0}, numel = 1;
  int wnd = shape ? (int)PyTuple_Size(shape) : 0;
  char wtext[96], gtext[96];
  for (int d = 0; d < wnd && d < 4; d++) {
    want[d] = PyLong_AsSsize_t(PyTuple_GetItem(shape, d));
    numel *= want[d];
  }
  shape_text(wtext, sizeof wtext, want, wnd);
  int flags = PyBUF_FORMAT | PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, view, flags) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError,
                 "variable '%s': a %s is no%s buffer; expected a "
                 "C-contiguous float32 array of shape %s (a numpy array, or a "
                 "CPU tensor's .numpy())",
                 vname, Py_TYPE(obj)->tp_name, writable ? " writable" : "",
                 wtext);
    return -1;
  }
  shape_text(gtext, sizeof gtext, view->shape, view->ndim);
  const char *why = NULL;
  if (!is_f32(view->format) || view->itemsize != 4)
    why = "its dtype is not float32";
  else if (!PyBuffer_IsContiguous(view, 'C'))
    why = "it is not C-contiguous (pass np.ascontiguousarray(a) or "
          "tensor.contiguous(), a copy)";
  else if (view->len != numel * 4)
    why = "its size differs";
  else if (view->ndim != 1 && view->ndim != wnd)
    why = "its shape differs";
  else
    for (int d = 0; view->ndim == wnd && d < wnd; d++)
      if (view->shape[d] != want[d])
        why = "its shape differs";
  if (!why)
    return 0;
  PyErr_Format(PyExc_ValueError,
               "variable '%s': buffer of shape %s and format '%s' does not "
               "fit shape %s float32: %s; nothing was sent",
               vname, gtext, view->format ? view->format : "B", wtext, why);
  PyBuffer_Release(view);
  return -1;
}

int pyx_bufs_take(struct pyclient *self, PyObject *objs, const int *handles,
                  int n, int writable, struct pyx_bufs *out) {
  memset(out, 0, sizeof *out);
  PyObject *seq = PySequence_Fast(objs, "expected a list of buffers");
  if (!seq)
    return -1;
  if (PySequence_Fast_GET_SIZE(seq) != n) {
    PyErr_Format(PyExc_ValueError, "%d variables but %zd buffers", n,
                 PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    return -1;
  }
  out->views = PyMem_Calloc((size_t)n + 1, sizeof *out->views);
  out->ptrs = PyMem_Calloc((size_t)n + 1, sizeof *out->ptrs);
  if (!out->views || !out->ptrs) {
    Py_DECREF(seq);
    pyx_bufs_release(out);
    PyErr_NoMemory();
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (take_one(self, PySequence_Fast_GET_ITEM(seq, i), handles[i], writable,
                 &out->views[i])) {
      Py_DECREF(seq);
      pyx_bufs_release(out);
      return -1;
    }
    out->ptrs[i] = out->views[i].buf;
    out->n++;
  }
  Py_DECREF(seq);
  return 0;
}

void pyx_bufs_release(struct pyx_bufs *b) {
  for (int i = 0; i < b->n; i++)
    PyBuffer_Release(&b->views[i]);
  PyMem_Free(b->views);
  PyMem_Free(b->ptrs);
  memset(b, 0, sizeof *b);
}

int pyx_handles(struct pyclient *self, PyObject *vars, int **out, int *n) {
  PyObject *seq = PySequence_Fast(vars, "expected a list of variables");
  if (!seq)
    return -1;
  Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
  int *h = PyMem_Calloc((size_t)k + 1, sizeof *h);
  if (!h) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < k; i++) {
    PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
    long idx = -1;
    if (PyUnicode_Check(v)) {
      idx = psc_find(self->c, PyUnicode_AsUTF8(v));
      if (idx < 0) {
        PyErr_Format(PyExc_KeyError, "variable '%U' was not declared", v);
        goto fail;
      }
    } else {
      idx = PyLong_AsLong(v);
      if (idx == -1 && PyErr_Occurred())
        goto fail;
      if (idx < 0 || idx >= PyList_Size(self->names)) {
        PyErr_Format(PyExc_KeyError, "variable handle %ld was not declared",
                     idx);
        goto fail;
      }
    }
    h[i] = (int)idx;
  }
  Py_DECREF(seq);
  *out = h;
  *n = (int)k;
  return 0;
fail:
  Py_DECREF(seq);
  PyMem_Free(h);
  return -1;
}

int pyx_enter(struct pyclient *self) {
  if (!self->c) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is closed");
    return -1;
  }
  PyThread_type_lock lock = self->lock; /* read with the GIL held */
  if (!PyThread_acquire_lock(lock, NOWAIT_LOCK)) {
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
  }
  if (!self->c) { /* closed while this call waited */
    PyThread_release_lock(self->lock);
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is closed");
    return -1;
  }
  return 0;
}

void pyx_leave(struct pyclient *self) { PyThread_release_lock(self->lock); }

int pyx_leave_call(struct pyclient *self, int rc) {
  if (rc && !PyErr_Occurred())
    pyx_raise(self->c, rc);
  pyx_leave(self);
  return rc ? -1 : 0;
}

int pyx_interrupted(void *arg) {
  (void)arg;
  PyGILState_STATE g = PyGILState_Ensure();
  int r = PyErr_CheckSignals() < 0;
  PyGILState_Release(g);
  return r;
}

static PyMethodDef module_methods[] = {
    {"set_log", pyx_set_log, METH_VARARGS,
     "set_log(level, callback): the library's log lines below level dropped "
     "(level < 0: unchanged), the others to callback(level, line), None: "
     "stderr"},
    {"table_init", (PyCFunction)(void (*)(void))pyx_table_init,
     METH_VARARGS | METH_KEYWORDS,
     "table_init(table, path=None, text=None) -> (seed, init, init_scale): "
     "the spec's job.seed and the table's initializer as the shards resolve "
     "them"},
    {"init_rows", (PyCFunction)(void (*)(void))pyx_init_rows,
     METH_VARARGS | METH_KEYWORDS,
     "init_rows(table, seed, init, init_scale, ids, out): each id's initial "
     "row into out (float32, len(ids) x dim), as a shard makes it"},
    {NULL}};

static struct PyModuleDef pyx_module = {
    PyModuleDef_HEAD_INIT, "_psd",
    "psd's client, in C (libpsclient); use the psd package over it.", -1,
    module_methods};

int pyx_criteo_add(PyObject *m); /* criteo.c: psd.criteo's reader */

PyMODINIT_FUNC PyInit__psd(void) {
  PyObject *m = PyModule_Create(&pyx_module);
  if (!m)
    return NULL;
  if (PyType_Ready(&pyx_client_type) < 0 || PyType_Ready(&pyx_serving_type) < 0)
    goto fail;
  pyx_error = PyErr_NewExceptionWithDoc(
      "psd.Error",
      "A psd call failed: str() says what and where (the shard, the "
      "variable); .code is libpsclient's code (negative), .grpc_status and "
      ".grpc_name the gRPC status a shard answered (0, 'OK' when none did).",
      PyExc_RuntimeError, NULL);
  if (!pyx_error)
    goto fail;
  Py_INCREF(pyx_error);
  Py_INCREF(&pyx_client_type);
  Py_INCREF(&pyx_serving_type);
  if (PyModule_AddObject(m, "Error", pyx_error) < 0 ||
      PyModule_AddObject(m, "Client", (PyObject *)&pyx_client_type) < 0 ||
      PyModule_AddObject(m, "Serving", (PyObject *)&pyx_serving_type) < 0)
    goto fail;
  if (pyx_criteo_add(m) < 0)
    goto fail;
  PyModule_AddIntConstant(m, "PLACE_AUTO", PSC_PLACE_AUTO);
  PyModule_AddIntConstant(m, "PLACE_SPLIT", PSC_PLACE_SPLIT);
  /* libpsclient's codes, psd.Error.code: every one psd/client.h lists
   * (psclient(3), ERRORS). */
#define PYX_ERRNO_CONST_(name, value)                                          \
  if (PyModule_AddIntConstant(m, #name, PSC_##name) < 0)                       \
    goto fail;
  PSC_ERRNO_MAP(PYX_ERRNO_CONST_)
#undef PYX_ERRNO_CONST_
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
