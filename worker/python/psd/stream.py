"""A stream of LIBSVM parts for PyTorch (docs/python.md, "A stream of
parts"; docs/ctr.md, "Training on a stream").

``StreamDir(path, batch_size)`` follows a directory of time-ordered parts
as dworker's ``job.ctr.stream`` does: a part is a regular file whose name
ends in ``suffix`` (``.svm``) and does not start with ``.``, taken in name
order once it is there (write it under another name, then rename it into
place); a part that appears under a name sorting before the last one taken
is skipped with a warning. The iteration waits for new parts (looking every
``poll_s`` seconds) and ends when the end marker (``end``, default
``END``) is in the directory and every part before it was read.

Each batch is a ``Batch`` of numpy arrays (``torch.from_numpy`` takes them
without a copy) from one part (a part's last batch may be shorter):

- ``labels``  float32 [B]: 0 or 1 (-1 and +1 read as 0 and 1);
- ``offsets`` int64 [B + 1]: example i's features are
  ``ids[offsets[i]:offsets[i + 1]]`` (``nn.EmbeddingBag``'s offsets are
  ``offsets[:-1]``);
- ``ids``     int64 [nnz]: the feature ids (a u64's bits);
- ``values``  float32 [nnz]: their values;
- ``part``    str: the part's file name.

``share``/``nshares``: the examples i of each part (0-based; blank and
``#`` lines not counted) with ``i % nshares == share``, as dworker splits a
part among workers. A mistake raises ValueError naming the file and line.
"""

import collections
import os
import time
import warnings

import numpy as np

from . import _share

__all__ = ["Batch", "StreamDir"]


#: One batch of a part.
Batch = collections.namedtuple("Batch", "labels offsets ids values part")


def _parse(path, share, nshares):
    """This share's examples of the LIBSVM file path: (labels, offsets,
    ids, values) as lists."""
    labels, offsets, ids, values = [], [0], [], []
    example = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split(b"#", 1)[0].split()
            if not line:
                continue
            mine = example % nshares == share
            example += 1
            try:
                label = int(line[0])
            except ValueError:
                label = None
            if label not in (0, 1, -1):
                raise ValueError("%s:%d: the label is not 0 or 1 (nor -1/+1)"
                                 % (path, lineno))
            if not mine:
                continue
            for tok in line[1:]:
                k, sep, v = tok.partition(b":")
                try:
                    i, x = int(k), float(v)
                except ValueError:
                    i = x = None
                if not sep or i is None or i < 0 or i >= 1 << 64:
                    raise ValueError("%s:%d: '%s' is not idx:val"
                                     % (path, lineno, tok.decode(errors="replace")[:40]))
                if x != x or x in (float("inf"), float("-inf")):
                    raise ValueError("%s:%d: the value of feature %d is not a "
                                     "finite number" % (path, lineno, i))
                ids.append(i)
                values.append(x)
            labels.append(1.0 if label == 1 else 0.0)
            offsets.append(len(ids))
    return labels, offsets, ids, values


class StreamDir(_share.Base):
    """An iterable of ``Batch``es of the parts landing in directory path,
    until its end marker (see the module's text). In a
    ``torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=k)``
    each loader process takes its own part of the share."""

    def __init__(self, path, batch_size, *, suffix=".svm", end="END",
                 poll_s=0.5, share=0, nshares=1):
        _share.check(batch_size, share, nshares)
        if not end or "/" in end:
            raise ValueError(f"end: want a file name, got {end!r}")
        if not poll_s > 0:
            raise ValueError(f"poll_s: want a number of seconds > 0, got "
                             f"{poll_s!r}")
        self.path = str(path)
        self.batch_size = int(batch_size)
        self.suffix = suffix
        self.end = end
        self.poll_s = float(poll_s)
        self.share = int(share)
        self.nshares = int(nshares)

    def _next_part(self, last, taken, warned):
        """The name of the next part after last, or None."""
        best = None
        with os.scandir(self.path) as it:
            for e in it:
                n = e.name
                if n.startswith(".") or not n.endswith(self.suffix) or \
                        n == self.suffix or not e.is_file():
                    continue
                if last is not None and n <= last:
                    if n not in taken and n not in warned:
                        warned.add(n)
                        warnings.warn(f"stream {self.path}: part {n} appeared "
                                      f"after {last} was taken: skipped")
                    continue
                if best is None or n < best:
                    best = n
        return best

    def parts(self):
        """The parts' names as they land, until the end marker."""
        last, taken, warned = None, set(), set()
        marker = os.path.join(self.path, self.end)
        while True:
            ended = os.path.exists(marker)  # before the listing
            name = self._next_part(last, taken, warned)
            if name is not None:
                last = name
                taken.add(name)
                yield name
            elif ended:
                return
            else:
                time.sleep(self.poll_s)

    def __iter__(self):
        share, nshares = _share.of_loader(self.share, self.nshares)
        b = self.batch_size
        for name in self.parts():
            labels, offsets, ids, values = _parse(
                os.path.join(self.path, name), share, nshares)
            labels = np.asarray(labels, np.float32)
            offsets = np.asarray(offsets, np.int64)
            ids = np.asarray(ids, np.uint64).view(np.int64)
            values = np.asarray(values, np.float32)
            for at in range(0, len(labels), b):
                o = offsets[at:at + b + 1]
                yield Batch(labels[at:at + b], o - o[0], ids[o[0]:o[-1]],
                            values[o[0]:o[-1]], name)

    def __repr__(self):
        return (f"StreamDir({self.path!r}, {self.batch_size}, share="
                f"{self.share}, nshares={self.nshares})")
