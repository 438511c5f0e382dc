#!/usr/bin/python3
"""psd.torch's embedding modules (worker/python/psd/embedding.py) against
real shards: Client.pull_rows_many / push_rows_many (outs written in place,
each table's SGD); EmbeddingBag (sum, mean, per_sample_weights, 2-D bags)
and Embedding give torch's F.embedding_bag / F.embedding over the pulled
rows; one step with a table of SGD moves each row by the gradient summed
over its repeats, one row per unique id pushed; a collection makes one
multi-table pull and one push per step; bounded staleness steps are torch's
SGD; two sync workers give the rows of two steps on the mean loss; ids past
id_bound, negative ids and a table of another dim raise naming the table; a
shard killed and restarted mid-training is survived; prefetch (pipeline) in
sync mode gives the rows of no prefetch.

Run: /usr/bin/python3 test_torch_emb.py BUILD_DIR [Case.test] (SKIP, exit 77,
without python3-torch or the psd package)."""
import os
import signal
import sys
import threading
import unittest

import numpy as np

import harness as h

psd = torch = F = pt = None
LR = 0.5  # the tables' SGD
_seed_lock = threading.Lock()


def setUpModule():
    global psd, torch, F, pt
    try:
        import torch as t
        import torch.nn.functional as f
    except ImportError as e:
        raise unittest.SkipTest("python3-torch is not installed: %s" % e)
    sys.path.insert(0, h.build_path("worker", "python"))
    try:
        import psd as p
        import psd.torch as ptorch
    except ImportError as e:
        raise unittest.SkipTest("the psd Python package is not built: %s" % e)
    psd, torch, F, pt = p, t, f, ptorch


def sgd_tables(*names, dim=4):
    return [{"name": n, "dim": dim, "id_bound": 50,
             "optimizer": {"type": "sgd", "lr": LR}} for n in names]


class Counting:
    """A psd.Client that counts its row calls."""

    def __init__(self, c):
        self.c = c
        self.calls = {"pull_rows_many": 0, "push_rows_many": 0,
                      "pull_rows": 0, "push_rows": 0}
        self.pushed = []

    def __getattr__(self, name):
        attr = getattr(self.c, name)
        if name in self.calls:
            def counted(*a, **kw):
                self.calls[name] += 1
                if name == "push_rows_many":
                    self.pushed.append([np.array(i) for i in a[1]])
                return attr(*a, **kw)
            return counted
        return attr


class Shards(h.ProcTest):
    def shards(self, job):
        self.spec = os.path.join(self.d, "spec.json")
        h.write_spec(self.spec, job=job)
        self.procs += [h.start_psd(self.spec, i) for i in range(2)]

    def client(self, task=None):
        c = psd.Client(self.spec, task)
        self.addCleanup(c.close)
        return c

    def weight(self, c, table, n=50):
        c = getattr(c, "c", c)  # not counted
        return torch.from_numpy(c.pull_rows(table, np.arange(n, dtype=np.uint64)))


class AsyncTest(Shards):
    def setUp(self):
        super().setUp()
        self.shards({"name": "emb", "optimizer": {"type": "sgd", "lr": LR},
                     "tables": sgd_tables("t", "u", "v", "w", "f", "r")
                     + [{"name": "wide", "dim": 4}]})

    def test_forward_equals_torch(self):
        c = self.client()
        bag = pt.EmbeddingBag(50, 4, mode="sum", table="t", client=c)
        mean = pt.EmbeddingBag(50, 4, mode="mean", table="t", client=c)
        emb = pt.Embedding(50, 4, table="t", client=c)
        W = self.weight(c, "t")
        x = torch.tensor([3, 7, 3, 49, 0, 7], dtype=torch.int64)
        offs = torch.tensor([0, 2, 2, 5])  # an empty bag too
        psw = torch.tensor([0.5, 2.0, -1.0, 3.0, 1.5, 0.25])
        one = torch.arange(6)
        with torch.no_grad():
            for got, want in (
                    (bag(x, offs), F.embedding_bag(x, W, offs, mode="sum")),
                    (mean(x, offs), F.embedding_bag(x, W, offs, mode="mean")),
                    (bag(x, offs, psw), F.embedding_bag(
                        x, W, offs, mode="sum", per_sample_weights=psw)),
                    (bag(x.view(2, 3)), F.embedding_bag(x.view(2, 3), W,
                                                         mode="sum")),
                    (emb(x.view(3, 2)), F.embedding(x.view(3, 2), W)),
                    # bags of one id each: a row gather, not embedding_bag
                    (bag(x, one, psw), F.embedding_bag(
                        x, W, one, mode="sum", per_sample_weights=psw)),
                    (mean(x, one), F.embedding_bag(x, W, one, mode="mean"))):
                self.assertEqual(got.shape, want.shape)
                np.testing.assert_allclose(got.numpy(), want.numpy(),
                                           rtol=1e-6, atol=1e-7)

    def test_one_step_of_sgd_one_row_per_unique_id(self):
        c = Counting(self.client())
        bag = pt.EmbeddingBag(50, 4, table="u", client=c)
        lin = torch.nn.Linear(4, 1)
        opt = pt.DistributedOptimizer(lin.named_parameters(), client=c,
                                      sparse=[bag])
        W = self.weight(c, "u").requires_grad_(True)
        x = torch.tensor([5, 9, 5, 5, 11, 9], dtype=torch.int64)
        offs = torch.tensor([0, 3])
        cvec = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 1.0, -1.0, 2.0]])
        (bag(x, offs) * cvec).sum().backward()
        lin(torch.ones(1, 4)).sum().backward()
        opt.step()
        (F.embedding_bag(x, W, offs, mode="sum") * cvec).sum().backward()
        want = (W - LR * W.grad).detach().numpy()
        got = self.weight(c, "u").numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        self.assertEqual(c.calls["push_rows_many"], 1)
        self.assertEqual(sorted(c.pushed[0][0].tolist()), [5, 9, 11])
        opt.finish()

    def test_collection_one_pull_and_one_push_per_step(self):
        c = Counting(self.client())
        bags = {"a": pt.EmbeddingBag(50, 4, table="v", client=c),
                "b": pt.EmbeddingBag(50, 4, table="w", client=c),
                "c": pt.EmbeddingBag(50, 4, table="v", client=c)}  # shared
        ebc = pt.EmbeddingBagCollection(bags)
        lin = torch.nn.Linear(4, 1)
        opt = pt.DistributedOptimizer(lin.named_parameters(), client=c,
                                      sparse=ebc)
        Wv, Ww = self.weight(c, "v"), self.weight(c, "w")
        for step in range(3):
            before = dict(c.calls)
            ids = torch.randint(0, 50, (8, 3))
            outs = ebc(ids)
            self.assertEqual(len(outs), 3)
            if step == 0:
                for f, W in ((0, Wv), (1, Ww), (2, Wv)):
                    np.testing.assert_allclose(outs[f].detach().numpy(),
                                               W[ids[:, f]].numpy(), rtol=1e-6)
            sum(lin(o).sum() for o in outs).backward()
            opt.step()
            self.assertEqual(c.calls["pull_rows_many"] - before["pull_rows_many"], 1)
            self.assertEqual(c.calls["push_rows_many"] - before["push_rows_many"], 1)
        self.assertEqual((c.calls["pull_rows"], c.calls["push_rows"]), (0, 0))
        # The dict form: bags of several ids, weights, one call too.
        before = dict(c.calls)
        feats = {"a": (torch.tensor([1, 2, 3]), torch.tensor([0, 1])),
                 "b": (torch.tensor([4, 4]), torch.tensor([0, 1]),
                       torch.tensor([2.0, 3.0])),
                 "c": torch.tensor([[7, 8], [9, 7]])}
        with torch.no_grad():
            outs = ebc(feats)
        Wv, Ww = self.weight(c, "v"), self.weight(c, "w")
        np.testing.assert_allclose(outs[0].numpy(), F.embedding_bag(
            feats["a"][0], Wv, feats["a"][1], mode="sum").numpy(), rtol=1e-6)
        np.testing.assert_allclose(outs[1].numpy(), F.embedding_bag(
            feats["b"][0], Ww, feats["b"][1], mode="sum",
            per_sample_weights=feats["b"][2]).numpy(), rtol=1e-6)
        np.testing.assert_allclose(outs[2].numpy(), F.embedding_bag(
            feats["c"], Wv, mode="sum").numpy(), rtol=1e-6)
        self.assertEqual(c.calls["pull_rows_many"] - before["pull_rows_many"], 1)
        opt.finish()

    def test_client_many_tables_in_one_call(self):
        """pull_rows_many writes the outs given (no copy) with the rows
        pull_rows gives; push_rows_many applies each table's SGD."""
        c = self.client()
        c.declare_table("t", 4, 50)
        c.declare_table("w", 4, 50)
        ids = [np.array([1, 7, 1], np.uint64), np.array([49], np.uint64)]
        outs = [np.zeros((3, 4), np.float32), np.zeros((1, 4), np.float32)]
        got = c.pull_rows_many(["t", "w"], ids, outs)
        self.assertIs(got[0], outs[0])
        self.assertIs(got[1], outs[1])
        np.testing.assert_array_equal(outs[0], c.pull_rows("t", ids[0]))
        np.testing.assert_array_equal(outs[1], c.pull_rows("w", ids[1]))
        g = [np.ones((3, 4), np.float32), np.full((1, 4), 2, np.float32)]
        self.assertFalse(c.push_rows_many(["t", "w"], ids, g))
        after = c.pull_rows_many(["t", "w"], ids)
        np.testing.assert_allclose(after[0][0], outs[0][0] - LR * 2, rtol=1e-6)
        np.testing.assert_allclose(after[0][1], outs[0][1] - LR, rtol=1e-6)
        np.testing.assert_allclose(after[1][0], outs[1][0] - LR * 2, rtol=1e-6)

    def test_errors_name_the_table(self):
        c = self.client()
        bag = pt.EmbeddingBag(50, 4, table="f", client=c)
        with self.assertRaisesRegex(IndexError, r"table 'f': id 50 is not "
                                    r"below num_embeddings 50"):
            bag(torch.tensor([[1, 50]]))
        with self.assertRaisesRegex(IndexError, r"table 'f': id -3 is negative"):
            bag(torch.tensor([[-3, 1]]))
        with self.assertRaises(psd.Error) as cm:  # job.tables says dim 4
            pt.EmbeddingBag(50, 8, table="wide", client=c)
        self.assertIn("'wide'", str(cm.exception))
        with self.assertRaises(KeyError) as cm:
            c.pull_rows_many(["f", "nope"], [np.zeros(1, np.uint64)] * 2,
                             [np.zeros((1, 4), np.float32)] * 2)
        self.assertIn("'nope'", str(cm.exception))
        with self.assertRaisesRegex(ValueError, "table 'f'"):
            c.push_rows_many(["f"], [np.zeros(2, np.uint64)],
                             [np.zeros((2, 3), np.float32)])


class RestartTest(Shards):
    """Async, checkpoints every 5 pushes: a shard killed (-9) and
    restarted from its checkpoint while training goes on."""

    def setUp(self):
        super().setUp()
        self.shards({"name": "embck", "optimizer": {"type": "sgd", "lr": LR},
                     "tables": sgd_tables("r"),
                     "checkpoint": {"dir": os.path.join(self.d, "ck"),
                                    "every_steps": 5}})

    def test_shard_restart_is_survived(self):
        c = self.client()
        bag = pt.EmbeddingBag(50, 4, table="r", client=c)
        lin = torch.nn.Linear(4, 1)
        opt = pt.DistributedOptimizer(lin.named_parameters(), c, sparse=bag)
        gen = torch.Generator().manual_seed(1)

        def step():
            x = torch.randint(0, 50, (16, 2), generator=gen)
            lin(bag(x)).sum().backward()
            opt.step()
        for _ in range(3):
            step()
        self.procs[1].wait_for("checkpoint (every_steps) at step ", timeout=60)
        self.procs[1].stop(signal.SIGKILL)
        restart = threading.Timer(1.0, lambda: self.procs.append(
            h.start_psd(self.spec, 1)))
        restart.start()
        for _ in range(5):  # rides out the outage: retried, not raised
            step()
        restart.join()
        self.assertEqual(len(self.procs), 3, "ps:1 did not start again")
        self.procs[2].wait_for("resumed from step ")
        self.assertTrue(np.isfinite(c.pull_rows(
            "r", np.arange(50, dtype=np.uint64))).all())
        opt.finish()


class StalenessTest(Shards):
    """Bounded staleness (job.sync.staleness 0), one worker: its steps are
    sequential SGD, rows and dense layer, as torch's."""

    def setUp(self):
        super().setUp()
        self.shards({"name": "embssp",
                     "sync": {"mode": "async", "staleness": 0},
                     "optimizer": {"type": "sgd", "lr": LR},
                     "tables": sgd_tables("q")})

    def test_steps_equal_torch_sgd(self):
        c = self.client("worker:0")
        self.assertEqual((c.mode, c.staleness), ("async", 0))
        bag = pt.EmbeddingBag(50, 4, table="q", client=c)
        W = self.weight(c, "q").requires_grad_(True)
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 1)
        ref_lin = torch.nn.Linear(4, 1)
        ref_lin.load_state_dict(lin.state_dict())
        opt = pt.DistributedOptimizer(lin.named_parameters(), client=c,
                                      sparse=bag)
        ref = torch.optim.SGD([W] + list(ref_lin.parameters()), lr=LR)
        gen = torch.Generator().manual_seed(2)
        for _ in range(3):
            x = torch.randint(0, 50, (6, 2), generator=gen)
            o = bag(x)
            (o.pow(2).sum() + lin(o).sum()).backward()
            opt.step()
            ref.zero_grad()
            o = F.embedding_bag(x, W, mode="sum")
            (o.pow(2).sum() + ref_lin(o).sum()).backward()
            ref.step()
        opt.finish()
        np.testing.assert_allclose(self.weight(c, "q").numpy(),
                                   W.detach().numpy(), rtol=1e-5, atol=1e-6)


class StragglerRowsTest(Shards):
    """Sync with 2 workers and replicas_to_aggregate 1: a worker's rows
    pushed for the first step (step 0) are staged as its own, so a worker
    the step did not admit changes no row."""

    def setUp(self):
        super().setUp()
        self.shards({"name": "embk1", "sync": {"mode": "sync",
                                              "replicas_to_aggregate": 1},
                     "optimizer": {"type": "sgd", "lr": LR},
                     "tables": sgd_tables("k")})

    def test_an_unadmitted_workers_step0_rows_are_dropped(self):
        c0, c1 = self.client("worker:0"), self.client("worker:1")
        for c in (c0, c1):
            c.declare_table("k", 4, 50)
        s0, s1 = c0.join(), c1.join()
        self.assertEqual((s0, s1), (0, 0))
        ids = np.array([7], np.uint64)
        w0 = c0.pull_rows("k", ids).copy()
        g0 = np.full((1, 4), 0.5, np.float32)
        g1 = np.full((1, 4), 8.0, np.float32)
        self.assertFalse(c1.push_rows("k", ids, g1, step=0))
        self.assertFalse(c0.push_rows("k", ids, g0, step=0))
        self.assertEqual(c0.admit(0), (True, 1))
        self.assertFalse(c1.admit(0)[0])  # the step had its one replica
        got = c0.pull_rows("k", ids, min_version=1)
        np.testing.assert_array_equal(got, (w0 - np.float32(LR) * g0)
                                      .astype(np.float32))
        # A client that did not join cannot stage rows.
        c2 = self.client()
        c2.declare_table("k", 4, 50)
        with self.assertRaisesRegex(psd.Error, "not joined"):
            c2.push_rows("k", ids, g1, step=0)


class SyncTest(Shards):
    def setUp(self):
        super().setUp()
        self.shards({"name": "embsync", "sync": {"mode": "sync"},
                     "optimizer": {"type": "sgd", "lr": LR},
                     "tables": sgd_tables("s", "p0", "p1")})

    def worker(self, k, table, batches, out, prefetch=False, wait=None):
        try:
            c = self.client("worker:%d" % k)
            with _seed_lock:  # torch's generator is the process's
                torch.manual_seed(0)
                lin = torch.nn.Linear(4, 1)
            ebc = pt.EmbeddingBagCollection(
                [pt.EmbeddingBag(50, 4, table=table, client=c)])
            opt = pt.DistributedOptimizer(lin.named_parameters(), c,
                                          sparse=[ebc], prefix=table + "/")
            it = pt.pipeline(batches, ebc) if prefetch else batches
            for ids in it:
                o = ebc(ids)[0]
                (o.pow(2).sum() + lin(o).sum()).backward()
                opt.step()
            opt.finish()
            out[k] = c.pull_rows(table, np.arange(50, dtype=np.uint64))
        except BaseException as e:
            out[k] = e

    def test_without_an_optimizer_forward_says_what_to_do(self):
        c = self.client("worker:0")
        bag = pt.EmbeddingBag(50, 4, table="s", client=c)
        with self.assertRaisesRegex(RuntimeError, r"\['s'\]: sync mode needs "
                                    r"a DistributedOptimizer"):
            bag(torch.tensor([[1, 2]]))

    def test_two_workers_equal_steps_of_the_mean(self):
        """Two sync workers, two steps: the rows of one process taking
        torch's SGD steps on the mean of both workers' losses (the dense
        layer too)."""
        gen = torch.Generator().manual_seed(5)
        b = [[torch.randint(0, 50, (6, 1), generator=gen) for _ in range(2)]
             for _ in range(2)]  # b[worker][step]
        c = self.client()
        pt.EmbeddingBag(50, 4, table="s", client=c)
        W = self.weight(c, "s").requires_grad_(True)
        out = {}
        ts = [threading.Thread(target=self.worker, args=(k, "s", b[k], out))
              for k in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for k in range(2):
            self.assertNotIsInstance(out[k], BaseException, out[k])
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 1)
        ref = torch.optim.SGD([W] + list(lin.parameters()), lr=LR)
        for step in range(2):
            ref.zero_grad()
            loss = 0
            for k in range(2):
                o = F.embedding_bag(b[k][step], W, mode="sum")
                loss = loss + (o.pow(2).sum() + lin(o).sum()) / 2
            loss.backward()
            ref.step()
        want = W.detach().numpy()
        np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[1], want, rtol=1e-5, atol=1e-6)

    def test_prefetch_gives_the_rows_of_no_prefetch(self):
        """One worker of a 1-worker sync job, 6 steps on repeated ids, from
        zero rows: the rows each step reads depend on the last (a squared
        loss), so a prefetched row one step stale shows."""
        gen = torch.Generator().manual_seed(9)
        batches = [torch.randint(0, 6, (8, 1), generator=gen)
                   for _ in range(6)]
        spec = os.path.join(self.d, "one.json")
        h.write_spec(spec, nworker=1, job={
            "name": "embone", "sync": {"mode": "sync"},
            "optimizer": {"type": "sgd", "lr": LR},
            "tables": [dict(t, init="zeros") for t in sgd_tables("p0", "p1")]})
        self.procs += [h.start_psd(spec, i) for i in range(2)]
        self.spec = spec
        out = {}
        self.worker(0, "p0", batches, out)
        plain = out[0]
        self.assertNotIsInstance(plain, BaseException, plain)
        self.worker(0, "p1", batches, out, prefetch=True)
        self.assertNotIsInstance(out[0], BaseException, out[0])
        self.assertFalse(np.allclose(plain[:6], 0))
        np.testing.assert_allclose(out[0][:6], plain[:6], rtol=1e-5,
                                   atol=1e-6)


if __name__ == "__main__":
    h.main()
