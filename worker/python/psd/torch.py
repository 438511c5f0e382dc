"""PyTorch through psd's shards: DistributedOptimizer (docs/python.md).

    import psd, psd.torch
    client = psd.Client()                      # pslaunch's PSD_SPEC / TF_CONFIG
    opt = psd.torch.DistributedOptimizer(model.named_parameters(), client,
                                         optimizer={"type": "adam", "lr": 1e-3})
    for xb, yb in batches:
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()                        # hooks push each gradient
        opt.step()                             # waits; next values pulled
    opt.finish()

The shape is Horovod's and BytePS's DistributedOptimizer, but the optimizer
runs on the shards: each parameter is declared there (with `optimizer`, or
the spec's job.optimizer), every gradient is pushed as backward produces it
(a tensor hook hands it to a pusher thread, which sends whatever is ready in
one call while backward goes on), and step() waits for the pushes, then
pulls the new values straight into the parameters' memory (zero copy:
param.data's numpy view). Sync, async and bounded staleness follow the
spec's job.sync. A parameter the shards should not hold (BatchNorm's running
statistics are buffers, not parameters, and are never sent; exclude others
by name with `exclude`) stays local and is not trained by psd.
"""
import fnmatch
import queue
import threading
import time

import torch

import psd


class DistributedOptimizer:
    """DistributedOptimizer(named_parameters, client=None, *, optimizer=None,
    exclude=(), prefix="", batch_size=None, bucket_mb=4.0)

    named_parameters: a model's named_parameters(). client: a psd.Client
    (None: psd.Client() from the environment pslaunch sets). optimizer: a
    dict in job.optimizer's form applied by the shards to every parameter
    (None: the spec's). exclude: fnmatch patterns of parameter names kept
    local. prefix: put before every name on the shards (two models in one
    job). batch_size: the examples each step reports (default the spec's
    job.batch_size, else 0); set .examples before backward for a short batch.
    bucket_mb: gradients are pushed in buckets of about this many MiB as
    backward fills them (DDP's bucket_cap_mb, Horovod's fusion buffer): a
    push per bucket, while backward goes on; the last bucket goes from
    step() (in async mode with the pull of the new values, one round trip).
    0: every gradient alone, as soon as it is produced.

    The shards initialise each parameter with the distribution of its
    module's initial values: uniform in +-max|p| (PyTorch's default for
    Linear and Conv layers), zeros for an all-zero one. A parameter that
    starts as a nonzero constant (e.g. a norm layer's weight of ones) cannot
    be expressed so and is refused with a ValueError naming it: exclude it.
    """

    def __init__(self, named_parameters, client=None, *, optimizer=None,
                 exclude=(), prefix="", batch_size=None, bucket_mb=4.0):
        self.client = client if client is not None else psd.Client()
        c = self.client
        self.params, self.names, self.handles, self.values = [], [], [], []
        self.local = []
        for name, p in named_parameters:
            if not p.requires_grad:
                continue
            if any(fnmatch.fnmatchcase(name, pat) for pat in exclude):
                self.local.append(name)
                continue
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"parameter '{name}': {p.dtype} on "
                                 f"{p.device}; psd holds float32 CPU "
                                 "parameters (exclude it)")
            if not p.data.is_contiguous():
                raise ValueError(f"parameter '{name}' is not contiguous; "
                                 "exclude it")
            lo, hi = float(p.data.min()), float(p.data.max())
            if lo == hi and lo != 0.0:
                raise ValueError(
                    f"parameter '{name}' starts as the constant {lo}, which "
                    "the shards cannot initialise (zeros or uniform); "
                    "exclude it")
            scale = max(abs(lo), abs(hi))
            h = c.declare(prefix + name, tuple(p.shape) or (1,),
                          init="uniform" if scale > 0 else "zeros",
                          init_scale=scale, optimizer=optimizer)
            self.params.append(p)
            self.names.append(name)
            self.handles.append(h)
            self.values.append(p.data.numpy())  # shares p's memory
        if batch_size is None:
            batch_size = int(c.job.get("batch_size", 0))
        self.examples = int(batch_size)
        self.sync = c.mode == "sync"
        self.ssp = not self.sync and c.staleness >= 0
        # Async without a bound: a step's last push travels with the next
        # values' pull, one round trip (as dworker's push_pull).
        self.overlap = not self.sync and not self.ssp
        self.bucket_bytes = int(float(bucket_mb) * (1 << 20))
        self._bucket, self._bucket_bytes, self._queued = [], 0, 0
        self.early_pushes = 0  # buckets pushed while backward went on
        self.joined = c.task_index >= 0
        self.step_no = c.join() if self.joined else 0
        self.clock_no = 0
        self.steps = 0
        self.examples_done = 0
        self.t_first = None
        self.t_last = None
        self.dropped = 0
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._ready = queue.Queue()
        self._done = threading.Condition()
        self._pending = 0
        self._sent = [False] * len(self.params)
        self._closed = False
        self._first_push = True
        self._error = None
        self._pusher = threading.Thread(target=self._push_loop, daemon=True,
                                        name="psd-pusher")
        self._pusher.start()
        self._hooks = [p.register_hook(self._hook(i))
                       for i, p in enumerate(self.params)]
        self._pull()

    # ---- the pushes, as backward produces the gradients
    def _hook(self, i):
        def hook(grad):
            if self.t_first is None:
                self.t_first = time.monotonic()
            g = grad.detach().contiguous()
            self._bucket.append((i, g))
            self._bucket_bytes += g.numel() * 4
            self._queued += 1
            # A full bucket goes now, on the pusher thread; the one that
            # completes the step waits for step().
            if (self._bucket_bytes >= self.bucket_bytes
                    and self._queued < len(self.params)):
                bucket, self._bucket, self._bucket_bytes = self._bucket, [], 0
                with self._done:
                    self._pending += len(bucket)
                self._ready.put(bucket)
            return None
        return hook

    def _push_loop(self):
        while True:
            bucket = self._ready.get()
            if bucket is None:
                return
            try:
                self._send(bucket)
            except BaseException as e:  # raised again in step()
                self._error = e
            with self._done:
                self._pending -= len(bucket)
                self.early_pushes += 1
                self._done.notify_all()

    def _send(self, batch):
        """Pushes one bucket (a sync step's: stages it)."""
        if self._error is not None:
            return
        hs = [self.handles[i] for i, _ in batch]
        gs = [g.numpy() for _, g in batch]
        ex = self.examples if self._first_push else 0
        self._first_push = False
        for i, _ in batch:
            self._sent[i] = True
        if self.sync:
            if self.client.push_step(hs, gs, self.step_no, ex):
                self._closed = True
        else:
            self.client.push(hs, gs, ex)

    def _wait_pushes(self):
        with self._done:
            while self._pending > 0:
                self._done.wait()
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    # ---- the step
    def _pull(self):
        c = self.client
        if self.sync:
            while True:
                version = c.pull_at(self.handles, self.values, self.step_no)
                again = c.restarted()
                if again is None:
                    break
                self.step_no = again
            if version > self.step_no:
                self.step_no = version  # fell behind: go on from the newest
        else:
            if self.ssp:
                c.clock(self.clock_no)
            c.pull(self.handles, self.values)

    def zero_grad(self, set_to_none=True):
        """Clears the parameters' .grad (step() does it too: psd pushes
        from the hooks, so .grad is not used)."""
        for p in self.params:
            p.grad = None

    def step(self, closure=None):
        """Waits for this step's pushes; sync: asks to be counted in the
        step; then pulls the values the next forward uses."""
        loss = closure() if closure is not None else None
        self._wait_pushes()
        last, self._bucket, self._bucket_bytes = self._bucket, [], 0
        self._queued = 0
        if last and not self.overlap:
            self._send(last)  # sync or bounded staleness: staged or pushed
            last = None
        # The shards hold the gradient: .grad is dropped, so that the next
        # backward assigns it instead of adding into it.
        for p in self.params:
            p.grad = None
        c = self.client
        missing = [i for i, s in enumerate(self._sent) if not s]
        if missing and self.sync and not self._closed:
            # Parameters backward did not reach count as a zero gradient.
            zs = [torch.zeros_like(self.params[i]).numpy() for i in missing]
            if c.push_step([self.handles[i] for i in missing], zs,
                           self.step_no, 0):
                self._closed = True
        if self.sync:
            admitted, nxt = (False, self.step_no + 1)
            if not self._closed and c.restarted() is None:
                admitted, nxt = c.admit(self.step_no)
            if not admitted:
                self.dropped += 1
            self.step_no = max(nxt, self.step_no + 1)
        else:
            self.clock_no += 1
        final = last
        ex = self.examples if self._first_push else 0  # none pushed yet
        self._sent = [False] * len(self.params)
        self._closed = False
        self._first_push = True
        self.steps += 1
        self.examples_done += self.examples
        if final:
            c.push_pull_sets([self.handles[i] for i, _ in final],
                             [g.numpy() for _, g in final], self.handles,
                             self.values, ex)
        else:
            self._pull()
        self.t_last = time.monotonic()
        return loss

    def finish(self):
        """Leaves the job (reporting this worker's examples and training
        time for the job's rate), removes the hooks and stops the pusher.
        The client stays open."""
        if self._pusher is None:
            return
        self._ready.put(None)
        self._pusher.join()
        self._pusher = None
        for h in self._hooks:
            h.remove()
        if self._error is not None:  # a push after the last step() failed
            e, self._error = self._error, None
            raise e
        if self.joined and self.t_first is not None:
            end = self.t_last or time.monotonic()
            self.client.leave(self.examples_done, end - self.t_first,
                              time.monotonic() - end)

    def __del__(self):
        try:
            if self._pusher is not None:
                self._ready.put(None)
        except Exception:
            pass
