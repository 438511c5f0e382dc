"""psd.Serving: lookups from a psd job's serving tasks (docs/python.md,
"Serving").

    import numpy as np, psd
    s = psd.Serving("job.json")               # a replica of each shard
    rows, found, versions = s.lookup("emb", np.array([3, 17], np.uint64))
    w = s.dense("w", shape=(784, 10))

Every call releases the GIL and can be interrupted with Ctrl-C. A replica
that cannot be reached is left for the next one of its shard; a failure
raises psd.Error naming the table or variable and the serving task.
"""
import numpy as np

from . import _psd


class Serving:
    """A client of the serving tasks of the spec's cluster.serve.

    replica: the replica of each shard to use first (modulo the replicas
    per shard); None: one drawn from the process id. timeout_ms and
    retry_s: 0 takes the spec's job.rpc_timeout_ms and job.retry_s."""

    def __init__(self, spec, replica=None, name=None, timeout_ms=0,
                 retry_s=0.0):
        self._s = _psd.Serving(spec, -1 if replica is None else int(replica),
                               name, int(timeout_ms), float(retry_s))
        self._dims = {}

    @property
    def shards(self):
        """Training shards (nps)."""
        return self._s.shards

    @property
    def replicas(self):
        """Serving replicas per shard."""
        return self._s.replicas

    def task(self, shard):
        """J of the task serve:J that shard's lookups go to now."""
        return self._s.task(shard)

    def dim(self, table):
        """The table's floats per row."""
        if table not in self._dims:
            self._dims[table] = self._s.dim(table)
        return self._dims[table]

    def lookup(self, table, ids):
        """The rows of ids (any integer sequence) of table: (rows float32
        [n, dim], found bool [n], versions). found is False where an id was
        never published (its row is then the table's initial row);
        versions[k] is the publication version shard k's answer reflects
        (0 for a shard none of the ids belongs to)."""
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.uint64).ravel())
        rows = np.empty((ids.size, self.dim(table)), np.float32)
        found = np.zeros(ids.size, np.bool_)
        versions = self._s.lookup(table, ids, rows, found)
        return rows, found, np.array(versions, np.uint64)

    def dense(self, name, shape=None, versions=False):
        """Dense variable name, every shard's rows assembled: a float32
        array, flat, or of shape when given. versions=True: (array,
        versions per shard)."""
        numel, _ = self._s.dense(name)
        out = np.empty(numel, np.float32)
        _, vers = self._s.dense(name, out)
        if shape is not None:
            out = out.reshape(shape)
        return (out, np.array(vers, np.uint64)) if versions else out

    def close(self):
        """Closes the channels; calls afterwards raise RuntimeError."""
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
