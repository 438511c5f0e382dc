"""psd: train through a psd job's shards from Python (docs/python.md).

    import numpy as np, psd
    c = psd.Client("job.json", task="worker:0")   # or TF_CONFIG, or addrs=[...]
    w = c.declare("w", (784, 10), init="uniform", init_scale=0.05)
    value = np.empty((784, 10), np.float32)
    c.pull(w, value)                       # lands in value's own memory
    c.push(w, grad, examples=64)           # the shards apply the optimizer

Every network call releases the GIL and can be interrupted with Ctrl-C
(KeyboardInterrupt, the calls in flight cancelled). Buffers are anything with
the buffer protocol (numpy arrays; CPU tensors through .numpy(), which this
package calls for you): C-contiguous float32 of the variable's shape (or
flat), else ValueError naming the variable and both shapes, and nothing is
sent. A failed call raises psd.Error, whose .grpc_status/.grpc_name carry the
status a shard answered. For PyTorch, see psd.torch.DistributedOptimizer.
"""
import json
import os

from . import _psd

Error = _psd.Error

# libpsclient's codes, psd.Error.code (psclient(3), ERRORS): one condition,
# one code, whether the client or a shard found it.
EINVAL, ENOMEM, EIO, ENOENT, ESPEC, ERPC = (_psd.EINVAL, _psd.ENOMEM, _psd.EIO,
                                            _psd.ENOENT, _psd.ESPEC, _psd.ERPC)
ETIMEDOUT, ESHAPE, EEXIST, ERANGE = (_psd.ETIMEDOUT, _psd.ESHAPE, _psd.EEXIST,
                                     _psd.ERANGE)
EUNAVAIL, ECANCELED = _psd.EUNAVAIL, _psd.ECANCELED

_PLACEMENTS = {"auto": 0, "split": -1}
_INITS = {"zeros": 0, "uniform": 1}


def _buffer(x, what):
    """A buffer-protocol object for x: a torch tensor's CPU memory
    (shared, no copy), else x itself."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise ValueError(f"{what}: a {x.device.type} tensor; psd moves "
                             "CPU memory (use a CPU tensor)")
        return x.detach().numpy()
    return x


def _many(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


# ---- the library's log lines (psc_set_log), process-wide
_LOG_LEVELS = {"debug": 0, "info": 1, "warning": 2, "warn": 2, "error": 3,
               "off": 4}
# psc's levels as the logging module's.
_TO_LOGGING = (10, 20, 30, 40)
_log_callback = [None]


def _log_level(level):
    """psc's level for 'debug'..'off', or a logging level (logging.WARNING);
    ValueError for anything else."""
    if isinstance(level, str) and level.lower() in _LOG_LEVELS:
        return _LOG_LEVELS[level.lower()]
    if isinstance(level, int) and not isinstance(level, bool) and level >= 0:
        for k, at in enumerate(_TO_LOGGING):
            if level <= at:
                return k
        return _LOG_LEVELS["off"]
    raise ValueError(f"log level {level!r}; expected 'debug', 'info', "
                     "'warning', 'error', 'off' or a logging level")


def _forward(level, line):
    cb = _log_callback[0]
    if cb is not None:
        cb(_TO_LOGGING[level], line)


def set_log_level(level):
    """Drops the library's log lines below level: 'debug', 'info' (the
    default, or $PSD_LOG's), 'warning', 'error', 'off' (none), or a logging
    level (logging.WARNING). Process-wide: every client."""
    _psd.set_log(_log_level(level), _forward if _log_callback[0] else None)


def set_log_callback(callback):
    """Sends the library's log lines to callback(level, line) instead of
    stderr ("HH:MM:SS.mmm psd warn: ..."): level a logging level
    (logging.WARNING), line the message alone. It runs in the thread that
    logs (a client's call, or its heartbeat thread), with the GIL, and must
    not call a psd.Client. None: stderr again. Process-wide."""
    if callback is not None and not callable(callback):
        raise TypeError(f"set_log_callback: a {type(callback).__name__}; "
                        "expected a callable(level, line) or None")
    first = _log_callback[0] is None and callback is not None
    _log_callback[0] = callback
    _psd.set_log(-1, _forward if callback is not None else None)
    if first:
        import atexit
        # Lines after the interpreter's end go to stderr, not to Python.
        atexit.register(lambda: _psd.set_log(-1, None))


def log_to_logging(logger="psd"):
    """Sends the library's log lines to a logging.Logger (or its name) at
    their levels: psd.log_to_logging() and the 'psd' logger has them."""
    import logging
    log = logging.getLogger(logger) if isinstance(logger, str) else logger
    set_log_callback(log.log)


class Client:
    """A client of a psd job's shards.

    Client(spec=None, task=None, *, tf_config=None, addrs=None, job=None,
           token_file=None, name=None, timeout_ms=0, retry_s=0.0,
           connect_timeout_ms=0)

    spec: the job's cluster spec (a path, or its JSON text); tf_config: a
    TF_CONFIG-shaped JSON text; addrs: the shards' "host:port" list (then job names their
    job, token_file their token). Paths are str, bytes or os.PathLike, and
    a str that os.fsdecode made of a name's undecodable bytes opens those
    bytes, as open() does. With none of them: $PSD_SPEC (pslaunch
    sets it for a worker_command), else $TF_CONFIG. task: "worker:N", else
    the spec's or TF_CONFIG's task (or none: a client that does not join).
    timeout_ms: each call's deadline (0: job.rpc_timeout_ms); retry_s: how
    long a shard may stay unreachable while calls retry (0: job.retry_s);
    connect_timeout_ms: how long a declare waits for the shards to start
    (0: 60 s).
    """

    def __init__(self, spec=None, task=None, *, tf_config=None, addrs=None,
                 job=None, token_file=None, name=None, timeout_ms=0,
                 retry_s=0.0, connect_timeout_ms=0):
        if spec is None and tf_config is None and addrs is None:
            spec = os.environ.get("PSD_SPEC") or None
            if spec is None:
                tf_config = os.environ.get("TF_CONFIG")
                if not tf_config:
                    raise ValueError(
                        "psd.Client: no spec, tf_config or addrs, and "
                        "neither PSD_SPEC nor TF_CONFIG is set")
        if isinstance(spec, str) and spec.lstrip().startswith("{"):
            spec, tf_config = None, spec  # a TF_CONFIG-shaped text
        if task is None and os.environ.get("PSD_TASK"):
            task = os.environ["PSD_TASK"]
        if addrs is not None:
            kind, source = "addrs", [str(a) for a in addrs]
        elif tf_config is not None:
            kind, source = "tf_config", tf_config
        else:
            kind, source = "spec", os.fspath(spec)
        self._c = _psd.Client(kind, source, task, name, job, token_file,
                              int(timeout_ms), float(retry_s),
                              int(connect_timeout_ms))
        self.job = {}
        self._tables = {}
        try:
            if kind == "spec":
                with open(source) as f:
                    self.job = json.load(f).get("job", {})
            elif kind == "tf_config":
                self.job = json.loads(source).get("job", {})
        except (OSError, ValueError):
            pass  # the C side parsed it already; job is a convenience

    # ---- the job and the client
    num_shards = property(lambda self: self._c.num_shards)
    num_workers = property(lambda self: self._c.num_workers)
    task_index = property(lambda self: self._c.task_index)
    mode = property(lambda self: self._c.mode)
    staleness = property(lambda self: self._c.staleness)
    bytes_pulled = property(lambda self: self._c.bytes_pulled)
    bytes_pushed = property(lambda self: self._c.bytes_pushed)
    closed = property(lambda self: self._c.closed)

    def close(self):
        """Stops the heartbeat and closes the channels; later calls raise
        RuntimeError."""
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- variables
    def declare(self, name, shape, *, placement="auto", init="zeros",
                init_scale=0.0, optimizer=None, values=None):
        """Declares an f32 variable on the shards (created, or checked:
        ALREADY_EXISTS when it exists with another shape or optimizer) and
        returns its handle. placement: "auto" (split when >= 256 KiB, else
        on the shard its name hashes to: any client, any order, agrees),
        "split", or a shard index. optimizer: None (the spec's), or a dict
        (or JSON text) in job.optimizer's form, e.g. {"type": "adam",
        "lr": 1e-3}. values: None (init fills it), or its initial values, a
        C-contiguous float32 buffer of its size (a numpy array, a CPU
        tensor), else ValueError naming the variable: the first client to
        declare it supplies them, and every other pulls those."""
        if isinstance(placement, str):
            if placement not in _PLACEMENTS:
                raise ValueError(f"variable '{name}': placement "
                                 f"{placement!r}; expected 'auto', 'split' "
                                 "or a shard index")
            place = _PLACEMENTS[placement]
        else:
            place = int(placement) + 1
        if init not in _INITS:
            raise ValueError(f"variable '{name}': init {init!r}; expected "
                             "'zeros' or 'uniform'")
        if isinstance(optimizer, dict):
            optimizer = json.dumps(optimizer)
        shape = tuple(int(d) for d in shape) or (1,)
        if values is not None:
            values = _buffer(values, f"variable '{name}'")
        return self._c.declare(name, shape, place, _INITS[init],
                               float(init_scale), optimizer, values)

    def shape(self, var):
        """A declared variable's shape, by handle or name."""
        names = self._c.names
        if isinstance(var, int):
            if not 0 <= var < len(names):
                raise KeyError(f"variable handle {var} was not declared")
            return self._c.shapes[var]
        if var not in names:
            raise KeyError(f"variable '{var}' was not declared")
        return self._c.shapes[names.index(var)]

    def _outs(self, vars, outs):
        if outs is None:
            import numpy as np
            return [np.empty(self.shape(v), np.float32) for v in vars]
        return [_buffer(o, f"variable '{v}'")
                for v, o in zip(vars, _many(outs))] + _many(outs)[len(vars):]

    def _grads(self, vars, grads):
        return [_buffer(g, f"variable '{v}'")
                for v, g in zip(vars, _many(grads))] + _many(grads)[len(vars):]

    def pull(self, vars, outs=None):
        """Pulls variables (a handle, a name, or a list) into outs (a
        buffer or a list, written in place), or into new numpy arrays,
        returned."""
        single = not isinstance(vars, (list, tuple))
        vs = _many(vars)
        o = self._outs(vs, outs)
        self._c.pull(vs, o)
        return o[0] if single and outs is None else (outs if outs is not None
                                                     else o)

    def push(self, vars, grads, examples=0):
        """Pushes gradients; each shard applies the variable's optimizer.
        examples > 0 (the batch size) marks the start of this worker's step
        and counts in the job's examples/s: give it with a step's first
        push."""
        vs = _many(vars)
        self._c.push(vs, self._grads(vs, grads), int(examples))

    def push_pull(self, vars, grads, outs=None, examples=0):
        """push, then pull, in one round trip (the pull may or may not see
        this push)."""
        single = not isinstance(vars, (list, tuple))
        vs = _many(vars)
        o = self._outs(vs, outs)
        self._c.push_pull(vs, self._grads(vs, grads), o, int(examples))
        if outs is not None:
            return outs
        return o[0] if single else o

    def push_pull_sets(self, push_vars, grads, pull_vars, outs=None,
                       examples=0):
        """Pushes grads of push_vars and pulls pull_vars (into outs, or
        new arrays, returned), in one round trip."""
        pv, lv = _many(push_vars), _many(pull_vars)
        o = self._outs(lv, outs)
        self._c.push_pull_sets(pv, self._grads(pv, grads), lv, o,
                               int(examples))
        return outs if outs is not None else o

    # ---- synchronous steps and staleness
    def join(self, worker=None):
        """Joins the job's steps as this task's worker (or `worker`);
        returns the step now open."""
        return self._c.join(-1 if worker is None else int(worker))

    def pull_at(self, vars, outs, min_version):
        """Sync: pulls once every shard committed min_version steps;
        returns the steps committed."""
        if outs is None:
            raise ValueError("pull_at: outs are required (the buffers to "
                             "pull into)")
        vs = _many(vars)
        return self._c.pull_at(vs, self._outs(vs, outs), int(min_version))

    def push_step(self, vars, grads, step, examples=0):
        """Sync: stages gradients for `step`; True when a shard had closed
        the step already (the gradient is dropped)."""
        vs = _many(vars)
        return self._c.push_step(vs, self._grads(vs, grads), int(step),
                                 int(examples))

    def admit(self, step):
        """Sync: asks to count this worker's staged gradients in `step`;
        returns (admitted, next_step)."""
        return self._c.admit(int(step))

    def restarted(self):
        """Sync: the step to go on from when the job rolled back or the
        coordinator restarted since the last check, else None."""
        return self._c.restarted()

    def leave(self, examples, train_s, ended_s_ago=0.0):
        """Leaves the job, reporting this worker's examples and training
        time for the job's rate."""
        self._c.leave(int(examples), float(train_s), float(ended_s_ago))

    def clock(self, n):
        """Bounded staleness: this worker pushed n times; waits until the
        slowest live worker lets it go on."""
        self._c.clock(int(n))

    # ---- embedding tables
    def declare_table(self, name, dim, id_bound=0):
        """Declares an embedding table of dim floats per row."""
        self._c.declare_table(name, int(dim), int(id_bound))
        self._tables[name] = int(dim)

    def pull_rows(self, table, ids, out=None, min_version=0):
        """Pulls the rows of ids (np.uint64) into out ((n, dim) float32),
        or a new array, returned."""
        if out is None:
            import numpy as np
            out = np.empty((len(ids), self._dim(table)), np.float32)
        self._c.pull_rows(table, _buffer(ids, f"table '{table}'"),
                          _buffer(out, f"table '{table}'"), int(min_version))
        return out

    def push_rows(self, table, ids, grads, step=0):
        """Pushes row gradients ((n, dim) float32) of ids; repeats are
        summed. In a sync job: staged for `step` (0 included, the first
        step; the client must have joined); True when closed."""
        return self._c.push_rows(table, _buffer(ids, f"table '{table}'"),
                                 _buffer(grads, f"table '{table}'"),
                                 int(step))

    def pull_rows_many(self, tables, ids_list, outs=None, min_version=0):
        """pull_rows of many tables in one run: every table's and shard's
        messages at once (one round trip for a batch's rows). tables: a
        list of names; ids_list: each table's ids (np.uint64); outs: each
        table's (n, dim) float32 buffer, written in place, or None (new
        arrays). Returns the outs. An error names the table."""
        tables = list(tables)
        ids_list = list(ids_list)
        if outs is None:
            import numpy as np
            outs = [np.empty((len(i), self._dim(t)), np.float32)
                    for t, i in zip(tables, ids_list)]
        outs = list(outs)
        self._c.pull_rows_many(
            tables, [_buffer(i, f"table '{t}'")
                     for t, i in zip(tables, ids_list)],
            [_buffer(o, f"table '{t}'") for t, o in zip(tables, outs)],
            int(min_version))
        return outs

    def push_rows_many(self, tables, ids_list, grads_list, step=0):
        """push_rows of many tables in one run; in a sync job staged for
        `step` (0 included); True when a shard had closed it."""
        tables = list(tables)
        return self._c.push_rows_many(
            tables, [_buffer(i, f"table '{t}'")
                     for t, i in zip(tables, ids_list)],
            [_buffer(g, f"table '{t}'") for t, g in zip(tables, grads_list)],
            int(step))

    def _dim(self, table):
        if table not in self._tables:
            raise KeyError(f"table '{table}' was not declared")
        return self._tables[table]


from .serving import Serving  # noqa: E402  (after Error, which it raises)

__all__ = ["Client", "Serving", "Error", "set_log_level", "set_log_callback",
           "log_to_logging", "EINVAL", "ENOMEM", "EIO", "ENOENT", "ESPEC",
           "ERPC", "ETIMEDOUT", "ESHAPE", "EEXIST", "ERANGE", "EUNAVAIL",
           "ECANCELED"]
