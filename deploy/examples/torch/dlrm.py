"""A DLRM trained through psd's shards: the job's worker_command
(deploy/examples/torch-dlrm.json), started by pslaunch once per worker with
PSD_SPEC, PSD_TASK and TF_CONFIG set.

  pslaunch deploy/examples/torch-dlrm.json

The model is dlrm_model.DLRM, plain PyTorch; its 26 embedding bags are
psd.torch.EmbeddingBag, one table each (named C1..C26, id_bound the
field's cardinality, psd.criteo.CARDINALITIES), in one
psd.torch.EmbeddingBagCollection: a step pulls all its rows in one call
(the next batch's while this one computes) and pushes their gradients in
one, and the shards apply the tables' optimizer (job.tables or
job.table_defaults: adagrad). The dense part trains through
psd.torch.DistributedOptimizer with job.optimizer. Each worker reads its
share of the training file (lines i with i % workers == index) through
psd.criteo.Criteo: data_dir's, psd's generated data (by `psd-ctrgen
--format criteo`, when data_dir is new or psd's of other settings) or the
user's files as they are (docs/ctr.md, "Whose data"), named at the start
and at the end of the final: line (train=PATH test=PATH data=...). A progress line every job.log_every steps, and:

  final: worker=0 test_auc=0.7712 test_logloss=0.4601 true_auc=0.7853
         examples=1000000 train_s=30.1 examples_per_s=33222 rows_pulled=...
         rows_pushed=... rows_pulled_per_s=... rows_pushed_per_s=... mode=async

(worker 0 scores the test set; the other workers' lines have no test_*.)
With --predict-only it trains nothing: a client that does not join pulls
the shards' model and writes its predictions of the test set (or of
--predict-data FILE) to --predictions FILE (.npy).
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

import psd  # noqa: E402
import psd.torch  # noqa: E402


def build(client, args, seed):
    """The DLRM over psd's tables; the dense layers start from torch's
    init under the job's seed (the shards keep the first worker's)."""
    torch.manual_seed(seed)
    bags = {name: psd.torch.EmbeddingBag(card, args.dim, mode="sum", table=name, client=client)
            for name, card in zip(dm.FEATURES, dm.cardinalities(args.max_rows))}
    emb = psd.torch.EmbeddingBagCollection(bags, client=client)
    return dm.DLRM(emb, args.dim, args.bottom, args.top), emb


def main(argv=None):
    args = dm.parse_args(argv, "dlrm.py")
    torch.set_num_threads(args.threads)
    client = psd.Client(args.spec) if args.spec else psd.Client()
    job = client.job
    index, count = client.task_index, client.num_workers
    who = "worker:%d" % index if index >= 0 else "predict"
    seed = int(job.get("seed", 1))
    spec = args.spec or os.environ.get("PSD_SPEC")
    d = dm.data_dir(job, spec)
    truth, files = dm.ensure_data(d, args.train, args.test, args.data_seed, who)
    model, emb = build(client, args, seed)
    dense = [(n, p) for n, p in model.named_parameters() if not n.startswith("embeddings.")]
    b0 = client.bytes_pulled
    opt = psd.torch.DistributedOptimizer(dense, client, sparse=[emb])
    # A step pulls the dense values (as the constructor did once) and
    # pushes their gradients; the rest of its bytes are rows of dim floats.
    dense_bytes = client.bytes_pulled - b0
    if args.predict_only:
        p, _ = dm.predict(model, args.predict_data or files["test"], args.max_rows)
        np.save(args.predictions, p.astype(np.float32))
        print("predict: %d test predictions written to %s" % (len(p), args.predictions),
              flush=True)
        opt.finish()
        client.close()
        return 0
    epochs, batch = int(job.get("epochs", 1)), int(job.get("batch_size", 1024))
    log_every = int(job.get("log_every", 100))
    max_steps = int(job.get("max_steps", 0))
    print("%s: DLRM dim %d bottom %s top %s through %d shards, %s, %d epochs of batch %d"
          % (who, args.dim, args.bottom, args.top, client.num_shards, client.mode, epochs,
             batch), flush=True)
    loss_sum, t_log = 0.0, time.monotonic()
    pulled0, pushed0 = client.bytes_pulled, client.bytes_pushed
    done = False
    for epoch in range(epochs):
        data = dm.batches(files["train"], batch, index, count, args.max_rows)
        # Each next batch's rows are pulled while this one computes.
        for xd, xs, y in psd.torch.pipeline(data, emb, key=lambda b: b[1]):
            opt.examples = y.shape[0]
            loss = dm.train_loss(model, xd, xs, y)
            loss.backward()
            opt.step()
            loss_sum += float(loss)
            if opt.steps % log_every == 0:
                now = time.monotonic()
                print("%s: step %d epoch %d loss %.4f %.0f examples/s"
                      % (who, opt.steps, epoch, loss_sum / log_every,
                         log_every * batch / (now - t_log)), flush=True)
                loss_sum, t_log = 0.0, now
            if (max_steps and opt.steps >= max_steps) or \
                    (args.max_examples and opt.examples_done >= args.max_examples):
                done = True
                break
        if done:
            break
    opt.finish()
    train_s = (opt.t_last or time.monotonic()) - (opt.t_first or 0)
    row = 4 * args.dim
    pulled = (client.bytes_pulled - pulled0 - opt.steps * dense_bytes) // row
    pushed = (client.bytes_pushed - pushed0 - opt.steps * dense_bytes) // row
    extra = " steps=%d mode=%s dropped=%d" % (opt.steps, client.mode, opt.dropped)
    if index == 0:
        p, y = dm.predict(model, files["test"], args.max_rows)
        if args.predictions:
            np.save(args.predictions, p.astype(np.float32))
        line = dm.final_line("worker=%d" % index, p, y, truth, opt.examples_done, train_s,
                             pulled, pushed, extra, files)
    else:
        rate = opt.examples_done / max(train_s, 1e-9)
        line = ("final: worker=%d examples=%d train_s=%.2f examples_per_s=%.0f rows_pulled=%d "
                "rows_pushed=%d rows_pulled_per_s=%.0f rows_pushed_per_s=%.0f%s"
                % (index, opt.examples_done, train_s, rate, pulled, pushed,
                   pulled / max(train_s, 1e-9), pushed / max(train_s, 1e-9), extra))
    print(line, flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except psd.Error as e:
        print("dlrm.py: %s [%s]" % (e, e.grpc_name), file=sys.stderr)
        sys.exit(1)
