"""The one-process baseline of deploy/examples/torch-dlrm.json: the same
DLRM (dlrm_model.py) with torch.nn.EmbeddingBag(sparse=True) and
torch.optim.Adagrad for the rows (the spec's table optimizer: its lr, eps
and initial accumulator; the same uniform init), the spec's job.optimizer
for the dense part as a torch optimizer, on the same data, epochs and batch,
in one process.

  /usr/bin/python3 deploy/examples/torch/dlrm_local.py --spec deploy/examples/torch-dlrm.json

Prints progress lines and the final: line dlrm.py prints (examples_per_s:
its examples over the span from its first step to its last):

  final: local test_auc=0.7712 test_logloss=0.4601 true_auc=0.7853 examples=...
"""
import os
import sys
import time

THREADS = os.environ.get("PSD_TORCH_THREADS", "1")
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrm_model as dm  # noqa: E402


def dense_optimizer(params, opt):
    """job.optimizer (docs/training.md) as the torch optimizer the shards'
    update equals."""
    kind, lr = opt.get("type", "sgd"), float(opt.get("lr", 0.05))
    wd = float(opt.get("weight_decay", 0.0))
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(float(opt.get("beta1", 0.9)),
                                                      float(opt.get("beta2", 0.999))),
                                eps=float(opt.get("eps", 1e-8)), weight_decay=wd)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=float(opt.get("eps", 1e-10)),
                                   initial_accumulator_value=float(
                                       opt.get("initial_accumulator", 0.0)), weight_decay=wd)
    if kind in ("sgd", "momentum", "nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=float(opt.get("momentum", 0.0))
                               if kind != "sgd" else 0.0, nesterov=kind == "nesterov",
                               weight_decay=wd)
    raise ValueError("job.optimizer.type %r has no torch optimizer here" % kind)


def row_optimizer(params, conf):
    """The spec's table optimizer as torch.optim.Adagrad (sparse gradients)."""
    o = conf["optimizer"]
    if o.get("type", "adagrad") != "adagrad":
        raise ValueError("the tables' optimizer is %r; the baseline runs adagrad" % o["type"])
    return torch.optim.Adagrad(params, lr=float(o["lr"]), eps=float(o["eps"]),
                               initial_accumulator_value=float(o["initial_accumulator"]))


def build(job, args, cards=None):
    """The model with nn.EmbeddingBag rows, initialized as the spec says."""
    seed = int(job.get("seed", 1))
    torch.manual_seed(seed)
    conf = dm.table_settings(job, dm.FEATURES[0])
    bags = dm.Bags(cards or dm.cardinalities(args.max_rows), args.dim, sparse=True)
    if conf["init"] == "zeros":
        for b in bags.bags.values():
            torch.nn.init.zeros_(b.weight)
    else:
        dm.init_bags(bags, float(conf["init_scale"]), seed)
    return dm.DLRM(bags, args.dim, args.bottom, args.top), conf


def main(argv=None):
    args = dm.parse_args(argv, "dlrm_local.py")
    torch.set_num_threads(args.threads)
    spec = args.spec or os.environ.get("PSD_SPEC")
    if not spec:
        print("dlrm_local.py: --spec SPEC (or PSD_SPEC) is needed", file=sys.stderr)
        return 2
    job = dm.load_job(spec)
    d = dm.data_dir(job, spec)
    truth, files = dm.ensure_data(d, args.train, args.test, args.data_seed, "local")
    model, conf = build(job, args)
    rows = [p for n, p in model.named_parameters() if n.startswith("embeddings.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("embeddings.")]
    opts = [row_optimizer(rows, conf), dense_optimizer(dense, job.get("optimizer", {}))]
    epochs, batch = int(job.get("epochs", 1)), int(job.get("batch_size", 1024))
    log_every = int(job.get("log_every", 100))
    print("local: DLRM dim %d bottom %s top %s, %d epochs of batch %d, one process, "
          "%s threads" % (args.dim, args.bottom, args.top, epochs, batch, args.threads),
          flush=True)
    steps = examples = 0
    loss_sum, t_first, t_last, t_log = 0.0, None, None, time.monotonic()
    done = False
    for epoch in range(epochs):
        for xd, xs, y in dm.batches(files["train"], batch, cap=args.max_rows):
            if t_first is None:
                t_first = time.monotonic()
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss = dm.train_loss(model, xd, xs, y)
            loss.backward()
            for o in opts:
                o.step()
            steps += 1
            examples += y.shape[0]
            loss_sum += float(loss)
            t_last = time.monotonic()
            if steps % log_every == 0:
                print("local: step %d epoch %d loss %.4f %.0f examples/s"
                      % (steps, epoch, loss_sum / log_every,
                         log_every * batch / (t_last - t_log)), flush=True)
                loss_sum, t_log = 0.0, t_last
            if args.max_examples and examples >= args.max_examples:
                done = True
                break
        if done:
            break
    train_s = (t_last or 0) - (t_first or 0)
    p, y = dm.predict(model, files["test"], args.max_rows)
    if args.predictions:
        np.save(args.predictions, p.astype(np.float32))
    print(dm.final_line("local", p, y, truth, examples, train_s,
                        extra=" steps=%d threads=%d" % (steps, args.threads), files=files),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
