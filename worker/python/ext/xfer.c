/* psd.Client's network calls (ext.h): each takes its buffers with the
 * buffer protocol, releases the GIL for the call (Ctrl-C cancels it:
 * pyx_interrupted), and raises psd.Error naming the shard, the variable and
 * the gRPC status when it fails. */
#include "ext.h"

#include <string.h>

/* Runs expr with the GIL released and the client's lock held; sets rc.
 * expr reads only C memory taken before (ext.h, pyx_enter). */
#define NET_CALL(self, rc, expr)                                               \
  do {                                                                         \
    Py_BEGIN_ALLOW_THREADS(rc) = (expr);                                       \
    Py_END_ALLOW_THREADS                                                       \
  } while (0)

/* What a dense call names: handles, and buffers of values and/or grads. */
struct dense {
  int *h;                /* owned: variable handles */
  int n;                 /* how many */
  struct pyx_bufs vals;  /* pull destinations */
  struct pyx_bufs grads; /* push sources */
};

static void dense_free(struct dense *d) {
  PyMem_Free(d->h);
  pyx_bufs_release(&d->vals);
  pyx_bufs_release(&d->grads);
}

/* Takes vars, and outs and/or grads (either may be NULL). */
static int dense_take(struct pyclient *self, PyObject *vars, PyObject *outs,
                      PyObject *grads, struct dense *d) {
  memset(d, 0, sizeof *d);
  if (!self->c) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is closed");
    return -1;
  }
  if (pyx_handles(self, vars, &d->h, &d->n) ||
      (outs && pyx_bufs_take(self, outs, d->h, d->n, 1, &d->vals)) ||
      (grads && pyx_bufs_take(self, grads, d->h, d->n, 0, &d->grads))) {
    dense_free(d);
    return -1;
  }
  return 0;
}

/* Enters a call on d's buffers: takes the client's lock (frees d and
 * returns -1 with the exception set when it cannot). */
static int dense_enter(struct pyclient *self, struct dense *d) {
  if (!pyx_enter(self))
    return 0;
  dense_free(d);
  return -1;
}

/* Ends it: leaves the lock (pyx_leave_call), frees d; 0, or -1 with the
 * exception set for a failed call (rc). */
static int dense_done(struct pyclient *self, struct dense *d, int rc) {
  int r = pyx_leave_call(self, rc);
  dense_free(d);
  return r;
}

PyObject *pyx_pull(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"vars", "outs", NULL};
  PyObject *vars, *outs;
  struct dense d;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", kwlist, &vars, &outs) ||
      dense_take(self, vars, outs, NULL, &d))
    return NULL;
  if (dense_enter(self, &d))
    return NULL;
  NET_CALL(self, rc, psc_pull(self->c, d.h, d.vals.ptrs, d.n));
  if (dense_done(self, &d, rc))
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_push(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"vars", "grads", "examples", NULL};
  PyObject *vars, *grads;
  unsigned int examples = 0;
  struct dense d;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|I", kwlist, &vars, &grads,
                                   &examples) ||
      dense_take(self, vars, NULL, grads, &d))
    return NULL;
  if (dense_enter(self, &d))
    return NULL;
  NET_CALL(self, rc,
           psc_push(self->c, d.h, (const float *const *)d.grads.ptrs, d.n,
                    examples));
  if (dense_done(self, &d, rc))
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_push_pull(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"vars", "grads", "outs", "examples", NULL};
  PyObject *vars, *grads, *outs;
  unsigned int examples = 0;
  struct dense d;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|I", kwlist, &vars, &grads,
                                   &outs, &examples) ||
      dense_take(self, vars, outs, grads, &d))
    return NULL;
  if (dense_enter(self, &d))
    return NULL;
  NET_CALL(self, rc,
           psc_push_pull(self->c, d.h, (const float *const *)d.grads.ptrs,
                         d.vals.ptrs, d.n, examples));
  if (dense_done(self, &d, rc))
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_push_pull_sets(struct pyclient *self, PyObject *args,
                             PyObject *kw) {
  static char *kwlist[] = {"push_vars", "grads",    "pull_vars",
                           "outs",      "examples", NULL};
  PyObject *pvars, *grads, *lvars, *outs;
  unsigned int examples = 0;
  struct dense push, pull;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|I", kwlist, &pvars, &grads,
                                   &lvars, &outs, &examples) ||
      dense_take(self, pvars, NULL, grads, &push))
    return NULL;
  if (dense_take(self, lvars, outs, NULL, &pull)) {
    dense_free(&push);
    return NULL;
  }
  if (pyx_enter(self)) {
    dense_free(&push);
    dense_free(&pull);
    return NULL;
  }
  NET_CALL(self, rc,
           psc_push_pull_sets(self->c, push.h,
                              (const float *const *)push.grads.ptrs, push.n,
                              pull.h, pull.vals.ptrs, pull.n, examples));
  rc = pyx_leave_call(self, rc);
  dense_free(&push);
  dense_free(&pull);
  if (rc)
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_pull_at(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"vars", "outs", "min_version", NULL};
  PyObject *vars, *outs;
  unsigned long long min_version;
  uint64_t version = 0;
  struct dense d;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOK", kwlist, &vars, &outs,
                                   &min_version) ||
      dense_take(self, vars, outs, NULL, &d))
    return NULL;
  if (dense_enter(self, &d))
    return NULL;
  NET_CALL(self, rc,
           psc_pull_at(self->c, d.h, d.vals.ptrs, d.n, min_version, &version));
  if (dense_done(self, &d, rc))
    return NULL;
  return PyLong_FromUnsignedLongLong(version);
}

PyObject *pyx_push_step(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"vars", "grads", "step", "examples", NULL};
  PyObject *vars, *grads;
  unsigned long long step;
  unsigned int examples = 0;
  int closed = 0, rc;
  struct dense d;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOK|I", kwlist, &vars, &grads,
                                   &step, &examples) ||
      dense_take(self, vars, NULL, grads, &d))
    return NULL;
  if (dense_enter(self, &d))
    return NULL;
  NET_CALL(self, rc,
           psc_push_step(self->c, d.h, (const float *const *)d.grads.ptrs, d.n,
                         examples, step, &closed));
  if (dense_done(self, &d, rc))
    return NULL;
  return PyBool_FromLong(closed);
}

PyObject *pyx_join(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"worker", NULL};
  int worker = -1, rc;
  uint64_t step = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", kwlist, &worker) ||
      pyx_enter(self))
    return NULL;
  NET_CALL(self, rc, psc_join(self->c, worker, &step));
  if (pyx_leave_call(self, rc))
    return NULL;
  return PyLong_FromUnsignedLongLong(step);
}

PyObject *pyx_admit(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"step", NULL};
  unsigned long long step;
  uint64_t next = 0;
  int admitted = 0, rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "K", kwlist, &step) ||
      pyx_enter(self))
    return NULL;
  NET_CALL(self, rc, psc_admit(self->c, step, &admitted, &next));
  if (pyx_leave_call(self, rc))
    return NULL;
  return Py_BuildValue("(NK)", PyBool_FromLong(admitted),
                       (unsigned long long)next);
}

PyObject *pyx_restarted(struct pyclient *self, PyObject *unused) {
  uint64_t step = 0;
  if (!self->c) {
    PyErr_SetString(PyExc_RuntimeError, "psd.Client is closed");
    return NULL;
  }
  if (!psc_restarted(self->c, &step))
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(step);
}

PyObject *pyx_leave_job(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"examples", "train_s", "ended_s_ago", NULL};
  unsigned long long examples;
  double train_s, ago = 0;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "Kd|d", kwlist, &examples,
                                   &train_s, &ago) ||
      pyx_enter(self))
    return NULL;
  NET_CALL(self, rc, psc_leave(self->c, examples, train_s, ago));
  if (pyx_leave_call(self, rc))
    return NULL;
  Py_RETURN_NONE;
}

PyObject *pyx_clock(struct pyclient *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"clock", NULL};
  unsigned long long clock;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "K", kwlist, &clock) ||
      pyx_enter(self))
    return NULL;
  NET_CALL(self, rc, psc_clock(self->c, clock));
  if (pyx_leave_call(self, rc))
    return NULL;
  Py_RETURN_NONE;
}
