"""A PyTorch model trained on Fashion-MNIST through psd's shards: the job's
worker_command (deploy/examples/torch-mlp.json, torch-cnn.json), started by
pslaunch once per worker with PSD_SPEC, PSD_TASK and TF_CONFIG set.

  pslaunch deploy/examples/torch-mlp.json

Each worker trains an ordinary nn.Module (fmnist.MLP or fmnist.CNN, as
job.model says) on its share of the data; psd.torch.DistributedOptimizer
declares its parameters on the shards with the model's own initial values
(the first worker to declare one supplies them; every worker starts from
them), the shards apply the spec's job.optimizer, it pushes each gradient
as backward produces it and pulls the new values in step(). Sync, async or bounded staleness: the spec's job.sync.
Prints a progress line every job.log_every steps and a final line:

  final: worker=0 test_acc=0.8683 steps=2345 examples=150000 train_s=9.98
         examples_per_s=15030 mode=async dropped=0
"""
import os
import sys
import time

# One compute thread per worker (PSD_TORCH_THREADS to change): the workers
# and the shards share the host's cores, and idle OpenMP/OpenBLAS threads
# spin (sched_yield) where they should sleep. Set before numpy and torch
# load their thread pools.
THREADS = os.environ.get("PSD_TORCH_THREADS", "1")
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, THREADS)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402

import psd  # noqa: E402
import psd.torch  # noqa: E402


def main():
    torch.set_num_threads(int(THREADS))
    client = psd.Client()
    job = client.job
    index, count = client.task_index, client.num_workers
    who = f"worker:{index}"
    seed = int(job.get("seed", 1))
    torch.manual_seed(seed + index)
    data_dir = job.get("data_dir", fmnist.DATA_DIR)
    x, y = fmnist.load(data_dir, "train")
    xt, yt = fmnist.load(data_dir, "test")
    kind = job.get("model", "mlp")
    if kind == "cnn":
        model = fmnist.CNN(tuple(job.get("channels", (16, 32))))
        x, xt = x.reshape(-1, 1, 28, 28), xt.reshape(-1, 1, 28, 28)
    else:
        model = fmnist.MLP(tuple(job.get("hidden", (256, 128))))
    opt = psd.torch.DistributedOptimizer(model.named_parameters(), client)
    epochs = int(job.get("epochs", 3))
    batch = int(job.get("batch_size", 64))
    log_every = int(job.get("log_every", 100))
    max_steps = int(job.get("max_steps", 0))
    print(f"{who}: {kind} through {client.num_shards} shards, "
          f"{client.mode}, {epochs} epochs of batch {batch}", flush=True)
    loss_sum, seen, t_log = 0.0, 0, time.monotonic()
    for epoch in range(epochs):
        for xb, yb in fmnist.shard_batches(x, y, batch, epoch, seed, index,
                                           count):
            opt.examples = len(yb)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += float(loss)
            seen += 1
            if opt.steps % log_every == 0:
                now = time.monotonic()
                print(f"{who}: step {opt.steps} epoch {epoch} "
                      f"loss {loss_sum / seen:.4f} "
                      f"{log_every * batch / (now - t_log):.0f} examples/s",
                      flush=True)
                loss_sum, seen, t_log = 0.0, 0, now
            if max_steps and opt.steps >= max_steps:
                break
        if max_steps and opt.steps >= max_steps:
            break
    opt.finish()
    train_s = (opt.t_last or time.monotonic()) - (opt.t_first or 0)
    acc = fmnist.evaluate(model, xt, yt)
    print(f"final: worker={index} test_acc={acc:.4f} steps={opt.steps} "
          f"examples={opt.examples_done} train_s={train_s:.2f} "
          f"examples_per_s={opt.examples_done / max(train_s, 1e-9):.0f} "
          f"mode={client.mode} dropped={opt.dropped}", flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except psd.Error as e:
        print(f"train.py: {e} [{e.grpc_name}]", file=sys.stderr)
        sys.exit(1)
