/* The psd Python extension (_psd), over libpsclient's public API
 * (psd/client.h): its files share this header and nothing else.
 *
 *   module.c  the module, psd.Error (with the psc code and gRPC status),
 *             and the checks that turn Python buffers into float pointers
 *   client.c  the Client type: opening, declaring, its settings, closing
 *   xfer.c    its network calls: pulls, pushes, sync steps, clock
 *   rows.c    its row calls: one table's or many tables' in one run
 *   log.c     set_log: the library's log lines to a Python callable
 *   serving.c the Serving type: lookups from the serving tasks
 *   rowinit.c table_init, init_rows: a table's initial rows as the shards
 *             make them (common/), for psd.export
 *
 * Every network call releases the GIL and polls for signals (Ctrl-C) about
 * every 100 ms through psc_set_interrupt; buffers are taken with the buffer
 * protocol (no numpy C API) and the bytes go straight between them and the
 * wire. */
#ifndef PYX_EXT_H
#define PYX_EXT_H

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

/* The Client type (client.c), the Serving type (serving.c) and psd.Error
 * (module.c). */
extern PyTypeObject pyx_client_type;
extern PyTypeObject pyx_serving_type;
extern PyObject *pyx_error;

/* Raises psd.Error for a failed call of client c returning rc: message
 * psc_error's text, attributes code, grpc_status and grpc_name. Returns
 * NULL. */
PyObject *pyx_raise(psc_client *c, int rc);

/* The same for a message of one's own, code rc and gRPC status st. */
PyObject *pyx_raise_text(const char *msg, int rc, int st);

/* Buffers of one call, taken with the buffer protocol and released by
 * pyx_bufs_release. */
struct pyx_bufs {
  int n;            /* buffers taken */
  Py_buffer *views; /* owned: n views */
  float **ptrs;     /* owned: n pointers into them */
};

/* Takes objs (a list or tuple of n objects) as C-contiguous float32
 * buffers, writable when `writable`, each holding variable handles[i]'s
 * numel floats in its shape (or flat). On a bad one raises ValueError
 * naming the variable and both shapes and returns -1 (nothing taken). */
int pyx_bufs_take(struct pyclient *self, PyObject *objs, const int *handles,
                  int n, int writable, struct pyx_bufs *out);
void pyx_bufs_release(struct pyx_bufs *b);

/* Reads a list or tuple of variable handles or names into *out (owned,
 * PyMem_Free) and *n. Returns 0 or -1 with an exception set. */
int pyx_handles(struct pyclient *self, PyObject *vars, int **out, int *n);

/* Enters a network call on self: fails (RuntimeError) when the client is
 * closed, else takes its lock with the GIL released. Inside the call's
 * Py_BEGIN_ALLOW_THREADS section only C memory is read: pointers taken
 * before it (buffers, "s" arguments of the call's own tuple, encoded
 * names) and self->c, which the lock keeps (close takes it). */
int pyx_enter(struct pyclient *self);
void pyx_leave(struct pyclient *self);

/* Ends the call pyx_enter began, which returned rc: for a failed one sets
 * the exception a signal handler raised, else psd.Error from psc_error,
 * before the lock goes (another thread's call would start by clearing
 * that text). Returns 0, or -1 with the exception set. */
int pyx_leave_call(struct pyclient *self, int rc);

/* psc_set_interrupt's poll: with the GIL taken back for a moment, runs
 * Python's signal handlers; 1 when one raised (KeyboardInterrupt). */
int pyx_interrupted(void *arg);

/* The Client's network methods (xfer.c, rows.c), listed in client.c's table. */
PyObject *pyx_pull(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_push(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_push_pull(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_push_pull_sets(struct pyclient *self, PyObject *args,
                             PyObject *kw);
PyObject *pyx_pull_at(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_push_step(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_join(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_admit(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_restarted(struct pyclient *self, PyObject *unused);
PyObject *pyx_leave_job(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_clock(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_pull_rows(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_push_rows(struct pyclient *self, PyObject *args, PyObject *kw);
PyObject *pyx_pull_rows_many(struct pyclient *self, PyObject *args,
                             PyObject *kw);
PyObject *pyx_push_rows_many(struct pyclient *self, PyObject *args,
                             PyObject *kw);

/* _psd.set_log(level, callback): psc_set_log, lines to callback(level,
 * line) (None: stderr); level < 0 leaves the level as it is (log.c). */
PyObject *pyx_set_log(PyObject *mod, PyObject *args);

/* _psd.table_init(table, path=None, text=None) -> (seed, init,
 * init_scale) and _psd.init_rows(table, seed, init, init_scale, ids, out)
 * (rowinit.c). */
PyObject *pyx_table_init(PyObject *mod, PyObject *args, PyObject *kw);
PyObject *pyx_init_rows(PyObject *mod, PyObject *args, PyObject *kw);

#endif
