/* The psd Python extension (_psd), over libpsclient's public API
 * (psd/client.h): its files share this header and nothing else.
 *
 *   module.c  the module, psd.Error (with the psc code and gRPC status),
 *             and the checks that turn Python buffers into float pointers
 *   client.c  the Client type: opening, declaring, its settings, closing
 *   xfer.c    its network calls: pulls, pushes, sync steps, clock, rows
 *   log.c     set_log: the library's log lines to a Python callable
 *
 * Every network call releases the GIL and polls for signals (Ctrl-C) about
 * every 100 ms through psc_set_interrupt; buffers are taken with the buffer
 * protocol (no numpy C API) and the bytes go straight between them and the
 * wire. */
#ifndef PSD_PY_EXT_H
#define PSD_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pythread.h>

#include "psd/client.h"

/* A psd.Client. */
struct pyclient {
  PyObject_HEAD psc_client *c; /* owned; NULL once closed */
  PyThread_type_lock lock;     /* one call at a time per client */
  PyObject *names;             /* list: each declared variable's name */
  PyObject *shapes;            /* list: each variable's shape (a tuple) */
};

/* The Client type (client.c) and psd.Error (module.c). */
extern PyTypeObject psd_client_type;
extern PyObject *psd_error;

/* Raises psd.Error for a failed call of client c returning rc: message
 * psc_error's text, attributes code, grpc_status and grpc_name. Returns
 * NULL. */
PyObject *psd_raise(psc_client *c, int rc);

/* The same for a message of one's own, code rc and gRPC status st. */
PyObject *psd_raise_text(const char *msg, int rc, int st);

/* Buffers of one call, taken with the buffer protocol and released by
 * psd_bufs_release. */
struct psd_bufs {
  int n;            /* buffers taken */
  Py_buffer *views; /* owned: n views */
  float **ptrs;     /* owned: n pointers into them */
};

/* Takes objs (a list or tuple of n objects) as C-contiguous float32
 * buffers, writable when `writable`, each holding variable handles[i]'s
 * numel floats in its shape (or flat). On a bad one raises ValueError
 * naming the variable and both shapes and returns -1 (nothing taken). */
int psd_bufs_take(struct pyclient *self, PyObject *objs, const int *handles,
                  int n, int writable, struct psd_bufs *out);
void psd_bufs_release(struct psd_bufs *b);

/* Reads a list or tuple of variable handles or names into *out (owned,
 * PyMem_Free) and *n. Returns 0 or -1 with an exception set. */
int psd_handles(struct pyclient *self, PyObject *vars, int **out, int *n);

/* Enters a network call on self: fails (RuntimeError) when the client is
 * closed, else takes its lock with the GIL released. Inside the call's
 * Py_BEGIN_ALLOW_THREADS section only C memory is read: pointers taken
 * before it (buffers, "s" arguments of the call's own tuple, encoded
 * names) and self->c, which the lock keeps (close takes it). */
int psd_enter(struct pyclient *self);
void psd_leave(struct pyclient *self);

/* Ends the call psd_enter began, which returned rc: for a failed one sets
 * the exception a signal handler raised, else psd.Error from psc_error,
 * before the lock goes (another thread's call would start by clearing
 * that text). Returns 0, or -1 with the exception set. */
int psd_leave_call(struct pyclient *self, int rc);

/* psc_set_interrupt's poll: with the GIL taken back for a moment, runs
 * Python's signal handlers; 1 when one raised (KeyboardInterrupt). */
int psd_interrupted(void *arg);

/* The Client's network methods (xfer.c), listed in client.c's table. */
PyObject *psd_pull(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_push(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_push_pull(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_push_pull_sets(struct pyclient *self, PyObject *args,
                             PyObject *kw);
PyObject *psd_pull_at(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_push_step(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_join(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_admit(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_restarted(struct pyclient *self, PyObject *unused);
PyObject *psd_leave_job(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_clock(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_pull_rows(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *psd_push_rows(struct pyclient *self, PyObject *args, PyObject *kw);

/* _psd.set_log(level, callback): psc_set_log, lines to callback(level,
 * line) (None: stderr); level < 0 leaves the level as it is (log.c). */
PyObject *psd_set_log(PyObject *mod, PyObject *args);

#endif
