"""PyTorch through psd's shards: DistributedOptimizer (docs/python.md).

    import psd, psd.torch
    client = psd.Client()                      # pslaunch's PSD_SPEC / TF_CONFIG
    opt = psd.torch.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3),
        named_parameters=model.named_parameters(), client=client)
    for xb, yb in batches:
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()                        # hooks push each gradient
        opt.step()                             # waits; next values pulled
    opt.finish()

The shape is Horovod's and BytePS's DistributedOptimizer, but the optimizer
runs on the shards: each parameter is declared there with the module's own
values (the first worker to declare a parameter supplies them, every other
worker starts from them), with the torch optimizer's type and
hyper-parameters translated to job.optimizer's form (or a dict in that form,
or the spec's job.optimizer). Every gradient is pushed as backward produces
it (a tensor hook hands it to a pusher thread, which sends whatever is ready
in one call while backward goes on), and step() waits for the pushes, then
pulls the new values straight into the parameters' memory (zero copy:
param.data's numpy view). Sync, async and bounded staleness follow the
spec's job.sync. A parameter the shards should not hold (BatchNorm's running
statistics are buffers, not parameters, and are never sent; exclude others
by name with `exclude`) stays local and is not trained by psd.

Embedding tables: psd.torch.EmbeddingBag, Embedding and
EmbeddingBagCollection (psd/embedding.py) hold their rows in psd tables;
DistributedOptimizer(..., sparse=[model or modules]) steps them with the
dense part (sync: their row gradients staged with the step).
"""
import fnmatch
import math
import queue
import threading
import time
import warnings

import numpy as np
import torch

import psd
from psd.embedding import (Embedding, EmbeddingBag, EmbeddingBagCollection,
                           default_client, pipeline, rows_of)

__all__ = ["DistributedOptimizer", "EmbeddingBag", "Embedding",
           "EmbeddingBagCollection", "pipeline", "default_client"]

# The shards' optimizer types (docs/training.md) a torch optimizer maps to.
_SHARD_TYPES = "sgd, momentum, nesterov, adagrad, adam, adamw"

# param_group keys that choose how torch computes an update, not what it is:
# the shards compute it their own way, so these are ignored.
_IMPL_KEYS = frozenset(("foreach", "differentiable", "fused", "capturable"))

# Per torch.optim class: the param_group keys psd translates, and those the
# shards cannot apply unless they hold their default.
_FIXED = {
    "SGD": {"dampening": 0, "maximize": False},
    "Adam": {"amsgrad": False, "maximize": False},
    "AdamW": {"amsgrad": False, "maximize": False},
    "Adagrad": {"lr_decay": 0, "initial_accumulator_value": 0,
                "maximize": False},
}
_TRANSLATED = {
    "SGD": {"lr", "weight_decay", "momentum", "nesterov"},
    "Adam": {"lr", "weight_decay", "betas", "eps"},
    "AdamW": {"lr", "weight_decay", "betas", "eps"},
    "Adagrad": {"lr", "weight_decay", "eps"},
}


def _num(x):
    """A hyper-parameter as a float (torch allows a 0-d tensor for lr)."""
    return float(x.item() if isinstance(x, torch.Tensor) else x)


def _shard_optimizer(opt, gi):
    """Param group gi of torch optimizer opt in job.optimizer's form, or a
    ValueError naming the class, the group and the option psd cannot apply."""
    kind = type(opt).__name__
    where = f"torch.optim.{kind}"
    if len(opt.param_groups) > 1:
        where += f" (param group {gi})"
    if type(opt) is not getattr(torch.optim, kind, None) or kind not in _FIXED:
        raise ValueError(
            f"{where}: psd's shards apply {_SHARD_TYPES}; pass "
            "torch.optim.SGD (with or without momentum, nesterov), Adam, "
            "AdamW or Adagrad, or optimizer={...} in job.optimizer's form "
            "(docs/training.md)")
    group = opt.param_groups[gi]
    for key, value in group.items():
        if key in ("params", "initial_lr") or key in _IMPL_KEYS:
            continue  # initial_lr: set by an lr scheduler, checked in step()
        if key in _FIXED[kind]:
            if value != _FIXED[kind][key]:
                raise ValueError(
                    f"{where}: {key}={value!r} is not applied by psd's "
                    f"shards (they run {_SHARD_TYPES} as docs/training.md "
                    f"writes them); leave {key} at "
                    f"{_FIXED[kind][key]!r}, or pass optimizer={{...}}")
        elif key not in _TRANSLATED[kind] and value not in (None, False, 0):
            raise ValueError(
                f"{where}: option {key}={value!r} is not one psd's shards "
                "apply; leave it at its default, or pass optimizer={...} in "
                "job.optimizer's form (docs/training.md)")
    out = {"lr": _num(group["lr"]),
           "weight_decay": _num(group.get("weight_decay", 0))}
    if kind == "SGD":
        mu = _num(group.get("momentum", 0))
        out["type"] = ("nesterov" if group.get("nesterov") else
                       "momentum" if mu else "sgd")
        if mu:
            out["momentum"] = mu
    elif kind in ("Adam", "AdamW"):
        out["type"] = kind.lower()
        out["beta1"], out["beta2"] = (_num(b) for b in group["betas"])
        out["eps"] = _num(group["eps"])
    else:
        out["type"] = "adagrad"
        out["eps"] = _num(group["eps"])
    return out


def _param_list(params):
    """[(name or None, tensor)] from named_parameters() or parameters();
    TypeError saying what to pass for anything else."""
    if isinstance(params, torch.nn.Module):
        raise TypeError("DistributedOptimizer: got a Module; pass "
                        "model.named_parameters()")
    if isinstance(params, torch.Tensor):
        params = [params]
    try:
        items = list(params)
    except TypeError:
        raise TypeError(f"DistributedOptimizer: got {type(params).__name__}; "
                        "pass model.named_parameters()") from None
    out = []
    for item in items:
        if isinstance(item, torch.Tensor):
            out.append((None, item))
        elif (isinstance(item, (tuple, list)) and len(item) == 2
              and isinstance(item[0], str)
              and isinstance(item[1], torch.Tensor)):
            out.append((item[0], item[1]))
        elif isinstance(item, dict):
            raise TypeError("DistributedOptimizer: got param groups; give "
                            "them to a torch optimizer and pass it with "
                            "named_parameters=model.named_parameters()")
        else:
            raise TypeError(f"DistributedOptimizer: a parameter is a "
                            f"{type(item).__name__}; pass "
                            "model.named_parameters()")
    if out and len({n is None for n, _ in out}) > 1:
        raise TypeError("DistributedOptimizer: named and unnamed parameters "
                        "mixed; pass model.named_parameters()")
    return out


def _sort_args(args, named_parameters, client, optimizer):
    """The positional arguments, told apart by type (a torch optimizer, a
    psd.Client, the parameters) so that both psd's order (named_parameters,
    client) and Horovod's (optimizer, named_parameters) work."""
    given = {"named_parameters": named_parameters, "client": client,
             "optimizer": optimizer}
    if len(args) > 3:
        raise TypeError(f"DistributedOptimizer: {len(args)} positional "
                        "arguments; expected at most named_parameters, "
                        "client and optimizer")
    for a in args:
        if a is None:  # a default given in its place: DO(named, None)
            continue
        if isinstance(a, torch.optim.Optimizer):
            key = "optimizer"
        elif isinstance(a, psd.Client):
            key = "client"
        elif isinstance(a, (dict, str)):
            raise TypeError("DistributedOptimizer: pass an optimizer in "
                            "job.optimizer's form as optimizer={...}")
        else:
            key = "named_parameters"
        if given[key] is not None:
            raise TypeError(f"DistributedOptimizer: {key} given twice")
        given[key] = a
    return given["named_parameters"], given["client"], given["optimizer"]


def _select(named, topt):
    """The parameters to train, each with its group's optimizer (None: the
    spec's or the dict given), and those left local: [(name, p, group)],
    [name]. With a torch optimizer, its parameters are the ones trained, in
    its order, named by named (by index without it)."""
    if topt is None:
        if named is None:
            raise TypeError("DistributedOptimizer: no parameters; pass "
                            "model.named_parameters()")
        return ([(n if n is not None else f"param.{i}", p, None)
                 for i, (n, p) in enumerate(named)], [])
    groups = {}
    order = []
    for gi, g in enumerate(topt.param_groups):
        for p in g["params"]:
            if id(p) not in groups:
                groups[id(p)] = gi
                order.append(p)
    if named is None:
        return [(f"param.{i}", p, groups[id(p)])
                for i, p in enumerate(order)], []
    names = {}
    for i, (n, p) in enumerate(named):
        names.setdefault(id(p), n if n is not None else f"param.{i}")
    unnamed = [p for p in order if id(p) not in names]
    if unnamed:
        raise ValueError(
            f"DistributedOptimizer: named_parameters does not name "
            f"{len(unnamed)} of the optimizer's parameters (shapes "
            f"{[tuple(p.shape) for p in unnamed[:4]]}); pass the "
            "named_parameters() of the model the optimizer trains")
    train = [(names[id(p)], p, groups[id(p)]) for p in order]
    kept = [n if n is not None else f"param.{i}"
            for i, (n, p) in enumerate(named)
            if id(p) not in groups and p.requires_grad]
    return train, kept


def _warn_clip(c):
    """The spec's job.optimizer.clip_norm is done by dworker before it
    pushes; these pushes leave as backward makes each gradient, so nothing
    clips them: said, not done silently. (A clip_norm in the optimizer
    passed here is refused by the shards: clipping is per job.)"""
    o = c.job.get("optimizer")
    if isinstance(o, dict) and o.get("clip_norm"):
        warnings.warn(
            f"the spec's job.optimizer has clip_norm {o['clip_norm']}, which "
            "dworker applies before pushing; DistributedOptimizer pushes each "
            "gradient unclipped as backward makes it (clip in a tensor hook "
            "of your own, or drop clip_norm)", stacklevel=3)


class DistributedOptimizer:
    """DistributedOptimizer(named_parameters, client=None, *, optimizer=None,
    exclude=(), prefix="", batch_size=None, bucket_mb=4.0,
    backward_passes_per_step=1, sparse=None)
    DistributedOptimizer(optimizer, named_parameters=None, client=None, ...)

    The positional arguments are told apart by type, so psd's order and
    Horovod's both work. named_parameters: a model's named_parameters()
    (parameters() works too: they are then named "param.0", "param.1"...,
    the same on every worker that builds the same model). client: a
    psd.Client (None: psd.Client() from the environment pslaunch sets).
    optimizer: a torch.optim.SGD (momentum, nesterov), Adam, AdamW or Adagrad,
    whose type and hyper-parameters (per param group) the shards apply, and
    whose parameters are the ones trained (named by named_parameters); or a
    dict in job.optimizer's form applied to every parameter; or None (the
    spec's). An option the shards cannot apply (amsgrad, dampening,
    maximize, lr_decay, ...) is refused by name; a change of a torch
    optimizer's lr (an lr scheduler) is refused in step(). exclude: fnmatch
    patterns of parameter names kept local. prefix: put before every name on
    the shards (two models in one job). batch_size: the examples each step
    reports (default the spec's job.batch_size, else 0); set .examples
    before backward for a short batch. bucket_mb: gradients are pushed in
    buckets of about this many MiB as backward fills them (DDP's
    bucket_cap_mb, Horovod's fusion buffer): a push per bucket, while
    backward goes on; the last bucket goes from step() (in async mode with
    the pull of the new values, one round trip). 0: every gradient alone,
    as soon as it is produced. backward_passes_per_step: the backward passes
    summed locally into each step's one push (Horovod's); one more before
    step() raises RuntimeError. sparse: psd embedding modules (EmbeddingBag,
    Embedding, EmbeddingBagCollection), or a model holding them, or a list:
    step() waits for their row pushes (async, SSP) or stages their row
    gradients for the step before it asks to be admitted (sync), and their
    pulls wait for the step's version; in sync mode they must use this
    optimizer's client.

    The shards start each parameter from the module's own values: the first
    worker to declare it supplies them, and every worker then pulls the same
    values (Horovod's broadcast of rank 0's parameters).
    """

    def __init__(self, *args, named_parameters=None, client=None,
                 optimizer=None, exclude=(), prefix="", batch_size=None,
                 bucket_mb=4.0, backward_passes_per_step=1, sparse=None):
        named, client, optimizer = _sort_args(args, named_parameters, client,
                                              optimizer)
        named = _param_list(named) if named is not None else None
        topt = optimizer if isinstance(optimizer, torch.optim.Optimizer) \
            else None
        if optimizer is not None and topt is None and \
                not isinstance(optimizer, (dict, str)):
            raise TypeError(f"DistributedOptimizer: optimizer is a "
                            f"{type(optimizer).__name__}; pass a torch "
                            "optimizer or a dict in job.optimizer's form")
        passes = int(backward_passes_per_step)
        if passes < 1:
            raise ValueError(f"backward_passes_per_step is {passes}; "
                             "expected >= 1")
        train, self.local = _select(named, topt)
        group_opts = ([_shard_optimizer(topt, gi)
                       for gi in range(len(topt.param_groups))]
                      if topt is not None else [])
        self.client = client if client is not None else default_client()
        c = self.client
        self.params, self.names, self.handles, self.values = [], [], [], []
        self.torch_optimizer = topt
        self._lrs = [(g, _num(g["lr"])) for g in topt.param_groups] \
            if topt is not None else []
        seen = set()
        for name, p, gi in train:
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
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
            # The module's own values: the first worker to declare it
            # supplies them, every other pulls those below.
            h = c.declare(prefix + name, tuple(p.shape) or (1,),
                          values=p.data,
                          optimizer=group_opts[gi] if gi is not None
                          else optimizer)
            self.params.append(p)
            self.names.append(name)
            self.handles.append(h)
            # Flat (a 0-d parameter is a variable of 1), sharing p's memory.
            self.values.append(p.data.view(-1).numpy())
        if batch_size is None:
            batch_size = int(c.job.get("batch_size", 0))
        _warn_clip(c)
        self.examples = int(batch_size)
        self.passes_per_step = passes
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
        self._passes = [0] * len(self.params)  # this step's, per parameter
        self._acc = [None] * len(self.params)  # their sum until the last
        self._ready = queue.Queue()
        self._done = threading.Condition()
        self._pending = 0
        self._sent = [False] * len(self.params)
        self._closed = False
        self._first_push = True
        self._error = None
        self._finished = False
        self._pusher = threading.Thread(target=self._push_loop, daemon=True,
                                        name="psd-pusher")
        self._pusher.start()
        self._hooks = [p.register_hook(self._hook(i))
                       for i, p in enumerate(self.params)]
        self.sparse = rows_of(sparse) if sparse is not None else []
        for r in self.sparse:
            r.attach(self)
        self._pull()

    # ---- the pushes, as backward produces the gradients
    def _hook(self, i):
        def hook(grad):
            if self.t_first is None:
                self.t_first = time.monotonic()
            n = self._passes[i] + 1
            if n > self.passes_per_step:
                raise RuntimeError(
                    f"psd.torch: parameter '{self.names[i]}' got gradient "
                    f"{n} before step(), with backward_passes_per_step="
                    f"{self.passes_per_step}: call step() after each "
                    "backward, or pass backward_passes_per_step=N to sum N "
                    "backward passes into one step")
            self._passes[i] = n
            g = grad.detach()
            if self._acc[i] is not None:
                g = self._acc[i] + g
            if n < self.passes_per_step:
                self._acc[i] = g.clone() if n == 1 else g  # not autograd's
                return None
            self._acc[i] = None
            self._add(i, g.contiguous().view(-1))
            return None
        return hook

    def _add(self, i, g):
        """Puts parameter i's gradient for this step in the bucket; a full
        bucket goes now, on the pusher thread, but the one that completes
        the step waits for step()."""
        self._bucket.append((i, g))
        self._bucket_bytes += g.numel() * 4
        self._queued += 1
        if (self._bucket_bytes >= self.bucket_bytes
                and self._queued < len(self.params)):
            bucket, self._bucket, self._bucket_bytes = self._bucket, [], 0
            with self._done:
                self._pending += len(bucket)
            self._ready.put(bucket)

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

    def _check_lr(self):
        """A torch optimizer's lr changed since the declare (an lr
        scheduler): the shards would go on with the old one."""
        for gi, (g, lr) in enumerate(self._lrs):
            now = _num(g["lr"])
            if not math.isclose(now, lr, rel_tol=1e-12, abs_tol=0.0):
                raise RuntimeError(
                    f"torch.optim.{type(self.torch_optimizer).__name__}'s lr "
                    f"(param group {gi}) changed from {lr} to {now}, by an "
                    "lr scheduler? The shards apply the lr the parameters "
                    "were declared with; give the schedule in "
                    "job.optimizer's \"schedule\" (docs/training.md)")

    def zero_grad(self, set_to_none=True):
        """Clears the parameters' .grad (step() does it too: psd pushes
        from the hooks, so .grad is not used)."""
        for p in self.params:
            p.grad = None

    def step(self, closure=None):
        """Waits for this step's pushes; sync: asks to be counted in the
        step; then pulls the values the next forward uses."""
        if self._finished:
            raise RuntimeError(
                "DistributedOptimizer.step() after finish(): this optimizer "
                "has left the job and pushes nothing; make a new one")
        self._check_lr()
        loss = closure() if closure is not None else None
        # Parameters with fewer backward passes than backward_passes_per_step
        # push the sum they have.
        for i, g in enumerate(self._acc):
            if g is not None:
                self._acc[i] = None
                self._add(i, g.contiguous().view(-1))
        self._passes = [0] * len(self.params)
        self._wait_pushes()
        for r in self.sparse:  # sync: staged for the step; else pushed
            if r.before_admit(self.step_no):
                self._closed = True
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
            zs = [np.zeros(self.values[i].size, np.float32) for i in missing]
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
        for r in self.sparse:  # sync: a prefetch may pull the new step now
            r.after_step()
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
        The client stays open; step() raises from now on."""
        if self._pusher is None:
            return
        self._finished = True
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
