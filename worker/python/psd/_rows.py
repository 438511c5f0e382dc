"""The rows' way to and from the shards for psd's embedding modules
(embedding.py): Rows, one per module or collection, pulls a batch's rows
(now, or prefetched on its background thread), pushes their gradients
(async/SSP: on that thread as backward makes them; sync: staged until
DistributedOptimizer.step() sends them with the step before admit), and
follows the optimizer's steps (attach, before_admit, after_step)."""
import queue
import threading

import numpy as np


def _mode_of(client):
    if client.mode == "sync":
        return "sync"
    return "ssp" if client.staleness >= 0 else "async"


class Job:
    """A background task of a Rows: a pull (prefetch) or a push."""

    def __init__(self, fn):
        self.fn = fn
        self.done = threading.Event()
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # raised again by whoever waits
            self.error = e
        self.done.set()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Rows:
    """The pulls and pushes of a set of tables on one client: the lookup of
    a batch (plan, fetch, pool) and its gradient's way to the shards, with a
    background thread (pushes in async/SSP, prefetches) and the sync
    staging DistributedOptimizer drives (attach, before_admit,
    after_step)."""

    def __init__(self, client, names):
        self.client = client
        self.names = names  # its tables, for messages
        self.mode = _mode_of(client)
        self.opt = None  # the DistributedOptimizer that steps it (attach)
        self.calls = {"pull": 0, "push": 0}  # multi-table calls made
        self._jobs = queue.Queue()
        self._thread = None
        self._pushes = []  # async/SSP pushes not yet waited for
        self._staged = []  # sync: (tables, ids, grads) for the next step
        self._prefetched = []  # FIFO of (key, Job; sync: (entry, Job))
        self._cv = threading.Condition()
        self._stepped = 0  # step() calls seen (after_step)
        self._lock = threading.Lock()  # _pushes, _staged

    # ---- the background thread
    def _submit(self, fn):
        job = Job(fn)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="psd-rows")
            self._thread.start()
        self._jobs.put(job)
        return job

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run()

    # ---- the optimizer's hooks
    def attach(self, opt):
        if self.opt not in (None, opt) and not self.opt._finished:
            raise ValueError("an embedding module is registered with two "
                             "DistributedOptimizers")
        if self.mode == "sync" and opt.client is not self.client:
            raise ValueError(
                f"embedding tables {self.names}: their client is "
                "not the DistributedOptimizer's; in sync mode they must be "
                "one client (pass client= to both, or neither)")
        self.opt = opt

    def wait_pushes(self):
        """Waits for the async/SSP pushes handed to the thread so far."""
        with self._lock:
            jobs, self._pushes = self._pushes, []
        for j in jobs:
            j.wait()

    def before_admit(self, step):
        """Sync: stages this step's row gradients (one call); True when a
        shard had closed the step. Async/SSP: waits for the pushes."""
        if self.mode != "sync":
            self.wait_pushes()
            return False
        with self._lock:
            staged, self._staged = self._staged, []
        if not staged:
            return False
        tables, ids, grads = merge(staged)
        self.calls["push"] += 1
        return bool(self.client.push_rows_many(tables, ids, grads, step=step))

    def after_step(self):
        """step() is done (sync: admitted, step_no the next step's)."""
        with self._cv:
            self._stepped += 1
            self._cv.notify_all()

    def version(self):
        """The min_version a pull now waits for (sync), else 0."""
        if self.mode != "sync":
            return 0
        if self.opt is None:
            raise RuntimeError(
                f"embedding tables {self.names}: sync mode needs a "
                "DistributedOptimizer to step them; pass "
                "DistributedOptimizer(..., sparse=[module])")
        return self.opt.step_no

    # ---- a lookup
    def fetch(self, plan, version):
        """Pulls a plan's unique rows into one flat float32 array."""
        buf = np.empty(plan.total, np.float32)
        outs = [buf[a:b].reshape(-1, d)
                for (a, b), d in zip(plan.spans, plan.dims)]
        self.calls["pull"] += 1
        self.client.pull_rows_many(plan.tables, plan.uids, outs,
                                   min_version=version)
        return buf

    def prefetch(self, key, make_plan):
        """Plans a later batch (make_plan(): its unique ids) and pulls its
        rows, both on the thread. Sync: the pull waits for the step() that
        opens the batch's step, unless forward claims it first (then
        forward pulls at the current step)."""
        if self.mode != "sync":
            def run_async():
                plan = make_plan()
                return plan, self.fetch(plan, 0)
            self._prefetched.append((key, self._submit(run_async)))
            return
        entry = {"claimed": False}
        with self._cv:
            seen = self._stepped

        def run():
            plan = make_plan()
            with self._cv:
                while self._stepped == seen and not entry["claimed"]:
                    self._cv.wait()
                if entry["claimed"]:
                    return plan, None
                entry["claimed"] = True
            return plan, self.fetch(plan, self.version())
        self._prefetched.append((key, (entry, self._submit(run))))

    def take(self, key):
        """The prefetched (plan, rows) for key (rows None: pull them now),
        or None. Prefetches queued before key's are dropped (their batches
        were not run); with no prefetch of key (another batch, an
        evaluation), the queue stays."""
        if all(k is not key for k, _ in self._prefetched):
            return None
        while True:
            k, job = self._prefetched.pop(0)
            if isinstance(job, tuple):  # sync
                entry, job = job
                with self._cv:
                    entry["claimed"] = True
                    self._cv.notify_all()
            if k is key:
                return job.wait()
            try:
                job.wait()
            except Exception:
                pass  # a batch not run: its errors do not matter

    def push(self, plan, grad):
        """A lookup's leaf gradient (flat, summed per unique id) to the
        shards: sync staged for step(), else on the thread now."""
        grads = [grad[a:b].view(-1, d).numpy()
                 for (a, b), d in zip(plan.spans, plan.dims)]
        if self.mode == "sync":
            with self._lock:
                self._staged.append((plan.tables, plan.uids, grads))
            return

        def run():
            self.calls["push"] += 1
            self.client.push_rows_many(plan.tables, plan.uids, grads)
        job = self._submit(run)
        with self._lock:
            # Those done are dropped (a loop without DistributedOptimizer
            # never waits); a failed one raises here.
            done = [j for j in self._pushes if j.done.is_set()]
            self._pushes = [j for j in self._pushes
                            if not j.done.is_set()] + [job]
        for j in done:
            j.wait()

    def close(self):
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


def merge(staged):
    """Several lookups' gradients in one call's lists (a table may repeat:
    the shards sum repeats)."""
    tables, ids, grads = [], [], []
    for t, i, g in staged:
        tables += t
        ids += i
        grads += g
    return tables, ids, grads
