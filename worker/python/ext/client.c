/* psd.Client's C half (ext.h): opening a client from a spec file, a
 * TF_CONFIG text or shard addresses; declaring variables and tables; the
 * job's settings; closing. The psd package's Client (psd/__init__.py) adds
 * names, numpy and torch conveniences over it. */
#include "ext.h"

#include <string.h>

/* Encodes file name obj (str, bytes or os.PathLike) into *out (a new
 * bytes object) as open() does: a str that os.fsdecode made of bytes
 * undecodable in the locale (surrogate escapes) is those bytes again. None
 * leaves *out NULL. what names the argument. Returns 0, or -1 with
 * TypeError or ValueError naming it and the file. */
static int fs_name(const char *what, PyObject *obj, PyObject **out) {
  *out = NULL;
  if (obj == Py_None || PyUnicode_FSConverter(obj, out))
    return 0;
  if (PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s: expected a path (str, bytes or os.PathLike), not %s",
                 what, Py_TYPE(obj)->tp_name);
    return -1;
  }
  /* UnicodeEncodeError (a lone surrogate) or ValueError (a NUL byte) */
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *value = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
#endif
  PyErr_Format(PyExc_ValueError, "%s %R: not a file name: %S", what, obj,
               value ? value : Py_None);
  Py_XDECREF(value);
  return -1;
}

/* Client(kind, source, task=None, name=None, job=None, token_file=None,
 *        timeout_ms=0, retry_s=0.0, connect_timeout_ms=0): kind "spec" (source
 * a path), "tf_config" (a JSON text, None: the environment's) or "addrs" (a
 * list of "host:port"). Paths are encoded with fs_name; the spec file is
 * read with the GIL released, into a local client that self takes once the
 * GIL is back. */
static int client_init(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"kind",       "source",  "task",
                           "name",       "job",     "token_file",
                           "timeout_ms", "retry_s", "connect_timeout_ms",
                           NULL};
  const char *kind, *task = NULL, *name = NULL, *job = NULL;
  PyObject *source = Py_None, *token = Py_None, *path = NULL, *tpath = NULL;
  int timeout_ms = 0, connect_ms = 0, rc, ret = -1;
  double retry_s = 0;
  char err[8192] = "";
  const char **addrs = NULL;
  psc_client *c = NULL;
  struct psc_options o;

  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|zzzOidi", kwlist, &kind,
                                   &source, &task, &name, &job, &token,
                                   &timeout_ms, &retry_s, &connect_ms))
    return -1;
  if (self->c) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is open already");
    return -1;
  }
  if (fs_name("token_file", token, &tpath))
    goto out;
  if (tpath) { /* psc_open_addrs passes it on in JSON (auth.token_file) */
    PyObject *utf8 = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(tpath),
                                          PyBytes_GET_SIZE(tpath), "strict");
    if (!utf8) {
      PyErr_Format(PyExc_ValueError,
                   "token_file %R: not a UTF-8 name, which a spec's "
                   "auth.token_file must be (rename the file)",
                   token);
      goto out;
    }
    Py_DECREF(utf8);
  }
  psc_options_init(&o);
  o.task = task;
  o.name = name;
  o.job = job;
  o.token_file = tpath ? PyBytes_AS_STRING(tpath) : NULL;
  o.timeout_ms = timeout_ms;
  o.retry_s = retry_s;
  o.connect_timeout_ms = connect_ms;
  if (!strcmp(kind, "spec")) {
    if (source == Py_None) {
      PyErr_SetString(PyExc_TypeError, "spec: expected a path, not None");
      goto out;
    }
    if (fs_name("spec", source, &path))
      goto out;
    const char *p = PyBytes_AS_STRING(path); /* path stays referenced */
    Py_BEGIN_ALLOW_THREADS rc = psc_open(&c, p, &o, err, sizeof err);
    Py_END_ALLOW_THREADS
  } else if (!strcmp(kind, "tf_config")) {
    const char *text = source == Py_None ? NULL : PyUnicode_AsUTF8(source);
    if (source != Py_None && !text)
      goto out;
    rc = psc_open_tf_config(&c, text, &o, err, sizeof err);
  } else if (!strcmp(kind, "addrs")) {
    PyObject *seq = PySequence_Fast(source, "addrs: expected a list of str");
    if (!seq)
      goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    addrs = PyMem_Calloc((size_t)n + 1, sizeof *addrs);
    for (Py_ssize_t i = 0; addrs && i < n; i++)
      if (!(addrs[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i)))) {
        Py_DECREF(seq);
        PyMem_Free(addrs);
        goto out;
      }
    rc = addrs ? psc_open_addrs(&c, addrs, (int)n, &o, err, sizeof err)
               : PSC_ENOMEM;
    PyMem_Free(addrs);
    Py_DECREF(seq);
  } else {
    PyErr_Format(PyExc_ValueError,
                 "kind '%s'; expected 'spec', 'tf_config' or 'addrs'", kind);
    goto out;
  }
  if (rc) {
    pyx_raise_text(err[0] ? err : psc_strerror(rc), rc, 0);
    goto out;
  }
  if (self->c) { /* another thread opened self while this one read */
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is open already");
    Py_BEGIN_ALLOW_THREADS psc_close(c);
    Py_END_ALLOW_THREADS
  } else {
    psc_set_interrupt(c, pyx_interrupted, NULL);
    self->c = c;
    ret = 0;
  }
out:
  Py_XDECREF(path);
  Py_XDECREF(tpath);
  return ret;
}

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  struct pyclient *self = (struct pyclient *)type->tp_alloc(type, 0);
  if (!self)
    return NULL;
  self->lock = PyThread_allocate_lock();
  self->names = PyList_New(0);
  self->shapes = PyList_New(0);
  if (!self->lock || !self->names || !self->shapes) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return (PyObject *)self;
}

/* Closes the client (its heartbeat stops, its channels close). */
static void close_client(struct pyclient *self) {
  psc_client *c = self->c;
  if (!c)
    return;
  self->c = NULL;
  Py_BEGIN_ALLOW_THREADS psc_close(c);
  Py_END_ALLOW_THREADS
}

static void client_dealloc(struct pyclient *self) {
  close_client(self);
  if (self->lock)
    PyThread_free_lock(self->lock);
  Py_XDECREF(self->names);
  Py_XDECREF(self->shapes);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_close(struct pyclient *self, PyObject *unused) {
  PyThread_type_lock lock = self->lock; /* read with the GIL held */
  if (self->c) {
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS close_client(self);
    PyThread_release_lock(lock);
  }
  Py_RETURN_NONE;
}

/* Takes values (not None) as variable name's initial values into *view:
 * a C-contiguous float32 buffer of numel elements, any shape. Returns 0,
 * or -1 with ValueError naming the variable. */
static int take_values(PyObject *values, const char *name, long long numel,
                       Py_buffer *view) {
  const char *fmt, *why = NULL;
  if (PyObject_GetBuffer(values, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError,
                 "variable '%s': values: a %s is no C-contiguous buffer; "
                 "expected %lld float32 (a numpy array, or a CPU tensor's "
                 ".numpy())",
                 name, Py_TYPE(values)->tp_name, numel);
    return -1;
  }
  fmt = view->format ? view->format : "B";
  if (*fmt == '<' || *fmt == '=' || *fmt == '@')
    fmt++;
  if (strcmp(fmt, "f") || view->itemsize != 4)
    why = "its dtype is not float32";
  else if (view->len != numel * 4)
    why = "its size differs";
  if (!why)
    return 0;
  PyErr_Format(PyExc_ValueError,
               "variable '%s': values of %zd elements and format '%s' do not "
               "fit its %lld float32: %s; nothing was declared",
               name, view->itemsize ? view->len / view->itemsize : view->len,
               view->format ? view->format : "B", numel, why);
  PyBuffer_Release(view);
  return -1;
}

/* declare(name, shape, placement=0, init=0, init_scale=0.0, optimizer=None,
 * values=None) -> handle. */
static PyObject *client_declare(struct pyclient *self, PyObject *args,
                                PyObject *kw) {
  static char *kwlist[] = {"name",       "shape",     "placement", "init",
                           "init_scale", "optimizer", "values",    NULL};
  const char *name, *optimizer = NULL;
  PyObject *shape, *values = Py_None;
  Py_buffer view = {0};
  int placement = PSC_PLACE_AUTO, init = PSC_INIT_ZEROS, rc;
  float scale = 0;
  int64_t dims[4];
  long long numel = 1;
  struct psc_var_opts o;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|iifzO", kwlist, &name, &shape,
                                   &placement, &init, &scale, &optimizer,
                                   &values))
    return NULL;
  PyObject *tup = PySequence_Tuple(shape);
  if (!tup)
    return NULL;
  Py_ssize_t nd = PyTuple_Size(tup);
  if (nd < 1 || nd > 4) {
    PyErr_Format(PyExc_ValueError,
                 "variable '%s': %zd dimensions; expected 1..4", name, nd);
    Py_DECREF(tup);
    return NULL;
  }
  for (Py_ssize_t d = 0; d < nd; d++) {
    dims[d] = PyLong_AsLongLong(PyTuple_GetItem(tup, d));
    if (dims[d] == -1 && PyErr_Occurred()) {
      Py_DECREF(tup);
      return NULL;
    }
    if (dims[d] <= 0) {
      PyErr_Format(PyExc_ValueError,
                   "variable '%s': dimension %zd is %lld; expected > 0", name,
                   d, (long long)dims[d]);
      Py_DECREF(tup);
      return NULL;
    }
    numel *= dims[d];
  }
  o = (struct psc_var_opts){placement, init, scale, optimizer};
  if (values != Py_None && take_values(values, name, numel, &view)) {
    Py_DECREF(tup);
    return NULL;
  }
  if (pyx_enter(self)) {
    if (view.obj)
      PyBuffer_Release(&view);
    Py_DECREF(tup);
    return NULL;
  }
  /* The view keeps values' memory alive and unmoved through the call. */
  const float *vals = view.obj ? (const float *)view.buf : NULL;
  Py_BEGIN_ALLOW_THREADS rc =
      psc_declare_values(self->c, name, (int)nd, dims, &o, vals);
  Py_END_ALLOW_THREADS;
  /* The error is read before the lock goes: another thread's call would
   * clear psc_error. */
  if (rc < 0 && !PyErr_Occurred())
    pyx_raise(self->c, rc);
  pyx_leave(self);
  if (view.obj)
    PyBuffer_Release(&view);
  if (rc < 0) {
    Py_DECREF(tup);
    return NULL;
  }
  if (rc == PyList_Size(self->names)) {
    PyObject *pyname = PyUnicode_FromString(name);
    if (!pyname || PyList_Append(self->names, pyname) ||
        PyList_Append(self->shapes, tup)) {
      Py_XDECREF(pyname);
      Py_DECREF(tup);
      return NULL;
    }
    Py_DECREF(pyname);
  }
  Py_DECREF(tup);
  return PyLong_FromLong(rc);
}

/* declare_table(name, dim, id_bound=0). */
static PyObject *client_declare_table(struct pyclient *self, PyObject *args,
                                      PyObject *kw) {
  static char *kwlist[] = {"name", "dim", "id_bound", NULL};
  const char *name;
  unsigned int dim;
  unsigned long long bound = 0;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sI|K", kwlist, &name, &dim,
                                   &bound))
    return NULL;
  if (pyx_enter(self))
    return NULL;
  Py_BEGIN_ALLOW_THREADS rc = psc_declare_table(self->c, name, dim, bound);
  Py_END_ALLOW_THREADS rc = pyx_leave_call(self, rc);
  if (rc)
    return NULL;
  Py_RETURN_NONE;
}

/* The job's settings and the client's counters, as attributes. */
static PyObject *get_info(struct pyclient *self, void *what) {
  const char *w = what;
  if (!self->c) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is closed");
    return NULL;
  }
  if (!strcmp(w, "num_shards"))
    return PyLong_FromLong(psc_num_shards(self->c));
  if (!strcmp(w, "num_workers"))
    return PyLong_FromLong(psc_num_workers(self->c));
  if (!strcmp(w, "task_index"))
    return PyLong_FromLong(psc_task_index(self->c));
  if (!strcmp(w, "mode"))
    return PyUnicode_FromString(psc_mode(self->c));
  if (!strcmp(w, "staleness"))
    return PyLong_FromLong(psc_staleness(self->c));
  if (!strcmp(w, "bytes_pulled"))
    return PyLong_FromUnsignedLongLong(psc_bytes_pulled(self->c));
  if (!strcmp(w, "bytes_pushed"))
    return PyLong_FromUnsignedLongLong(psc_bytes_pushed(self->c));
  Py_RETURN_NONE;
}

static PyObject *get_closed(struct pyclient *self, void *unused) {
  return PyBool_FromLong(self->c == NULL);
}

static PyObject *get_names(struct pyclient *self, void *unused) {
  return PyList_GetSlice(self->names, 0, PyList_Size(self->names));
}

static PyObject *get_shapes(struct pyclient *self, void *unused) {
  return PyList_GetSlice(self->shapes, 0, PyList_Size(self->shapes));
}

static PyGetSetDef client_getset[] = {
    {"num_shards", (getter)get_info, NULL, "shards in the job", "num_shards"},
    {"num_workers", (getter)get_info, NULL, "workers in the job's spec",
     "num_workers"},
    {"task_index", (getter)get_info, NULL,
     "this client's worker index, -1: none", "task_index"},
    {"mode", (getter)get_info, NULL, "'async' or 'sync' (job.sync.mode)",
     "mode"},
    {"staleness", (getter)get_info, NULL,
     "async: job.sync.staleness, -1: unbounded", "staleness"},
    {"bytes_pulled", (getter)get_info, NULL, "payload bytes pulled so far",
     "bytes_pulled"},
    {"bytes_pushed", (getter)get_info, NULL, "payload bytes pushed so far",
     "bytes_pushed"},
    {"closed", (getter)get_closed, NULL, "whether close() was called", NULL},
    {"names", (getter)get_names, NULL, "declared variables, by handle", NULL},
    {"shapes", (getter)get_shapes, NULL, "their shapes, by handle", NULL},
    {NULL}};

static PyMethodDef client_methods[] = {
    {"declare", (PyCFunction)(void (*)(void))client_declare,
     METH_VARARGS | METH_KEYWORDS,
     "declare(name, shape, placement=0, init=0, init_scale=0.0, "
     "optimizer=None, values=None) -> handle"},
    {"declare_table", (PyCFunction)(void (*)(void))client_declare_table,
     METH_VARARGS | METH_KEYWORDS, "declare_table(name, dim, id_bound=0)"},
#define KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS
    {"pull", KW(pyx_pull), "pull(vars, outs): pull into the buffers"},
    {"push", KW(pyx_push), "push(vars, grads, examples=0)"},
    {"push_pull", KW(pyx_push_pull),
     "push_pull(vars, grads, outs, examples=0): both, one round trip"},
    {"push_pull_sets", KW(pyx_push_pull_sets),
     "push_pull_sets(push_vars, grads, pull_vars, outs, examples=0)"},
    {"pull_at", KW(pyx_pull_at),
     "pull_at(vars, outs, min_version) -> version (sync)"},
    {"push_step", KW(pyx_push_step),
     "push_step(vars, grads, step, examples=0) -> closed (sync)"},
    {"join", KW(pyx_join), "join(worker=-1) -> step"},
    {"admit", KW(pyx_admit), "admit(step) -> (admitted, next_step) (sync)"},
    {"restarted", (PyCFunction)pyx_restarted, METH_NOARGS,
     "restarted() -> the step to go on from after a rollback, or None"},
    {"leave", KW(pyx_leave_job), "leave(examples, train_s, ended_s_ago=0.0)"},
    {"clock", KW(pyx_clock), "clock(n): bounded staleness"},
    {"pull_rows", KW(pyx_pull_rows),
     "pull_rows(table, ids, out, min_version=0)"},
    {"push_rows", KW(pyx_push_rows),
     "push_rows(table, ids, grads, step=0) -> closed"},
    {"pull_rows_many", KW(pyx_pull_rows_many),
     "pull_rows_many(tables, ids, outs, min_version=0): one run"},
    {"push_rows_many", KW(pyx_push_rows_many),
     "push_rows_many(tables, ids, grads, step=0) -> closed: one run"},
#undef KW
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close(): stops the heartbeat and closes the channels"},
    {NULL}};

PyTypeObject pyx_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "psd._psd.Client",
    .tp_doc = "A client of a psd job's shards (libpsclient).",
    .tp_basicsize = sizeof(struct pyclient),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = client_new,
    .tp_init = (initproc)client_init,
    .tp_dealloc = (destructor)client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
};
