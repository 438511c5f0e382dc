"""Criteo's click logs for PyTorch (docs/ctr.md, "The Criteo format").

``Criteo(path, batch_size)`` streams a Criteo Kaggle/Terabyte TSV file
(``label \\t I1..I13 \\t C1..C26``; plain or gzip) in batches, each a tuple
of numpy arrays (``torch.from_numpy`` takes them without a copy):

- ``dense``  float32 [B, 13]: the integer features, missing ones 0 (the
  DLRM takes ``log(1 + max(x, 0))``);
- ``sparse`` int64 [B, 26]: field f's value hashed with f into a u64 id
  (the C reader's ``dw_criteo_id``: FNV-1a 64 of the value's bytes, mixed
  with the field by splitmix64), ``% bounds[f]`` when ``bounds`` is given,
  else the u64's bits as an int64;
- ``labels`` float32 [B]: 0 or 1.

The C reader (worker/data/criteo.c, in the extension) reads and parses a
batch with the GIL released. A mistake in the file raises ValueError naming
the file and the line; a missing file FileNotFoundError.

``CARDINALITIES``: the 26 per-field bounds of psd-ctrgen's Criteo data (its
fields' numbers of distinct values, Criteo Kaggle's), what the DLRM's
tables hold: ``nn.EmbeddingBag(CARDINALITIES[f], dim)``.
"""

import numpy as np

from . import _psd, _share

__all__ = ["CARDINALITIES", "Criteo", "INTS", "CATS"]

#: Integer and categorical features a line.
INTS, CATS = 13, 26

#: The per-field bounds (ids % bound) of psd-ctrgen's Criteo data.
CARDINALITIES = tuple(_psd.CRITEO_CARDINALITIES)


class Criteo(_share.Base):
    """An iterable of batches ``(dense, sparse, labels)`` of a Criteo file.

    ``share``/``nshares``: the lines i (0-based, every line counted) with
    ``i % nshares == share``, as dworker's readers split a file among
    workers. In a ``torch.utils.data.DataLoader(dataset, batch_size=None,
    num_workers=k)`` each loader process reads its own part of the share.
    ``drop_last``: leave out a last batch smaller than ``batch_size``.
    Each iteration reads the file again from its start.
    """

    def __init__(self, path, batch_size, *, bounds=None, share=0, nshares=1,
                 drop_last=False):
        _share.check(batch_size, share, nshares)
        if bounds is not None:
            bounds = [int(b) for b in bounds]
            if len(bounds) != CATS or min(bounds) < 1:
                raise ValueError(f"bounds: want 26 whole numbers >= 1, got "
                                 f"{len(bounds)} (least {min(bounds or [0])})")
        self.path = str(path)
        self.batch_size = int(batch_size)
        self.bounds = bounds
        self.share = int(share)
        self.nshares = int(nshares)
        self.drop_last = bool(drop_last)

    def __iter__(self):
        share, nshares = _share.of_loader(self.share, self.nshares)
        reader = _psd.CriteoReader(self.path, self.bounds, share, nshares)
        b = self.batch_size
        try:
            while True:
                dense = np.empty((b, INTS), np.float32)
                sparse = np.empty((b, CATS), np.int64)
                labels = np.empty(b, np.float32)
                n = reader.read_into(dense, sparse, labels)
                if n < b:
                    if n == 0 or self.drop_last:
                        return
                    dense, sparse, labels = dense[:n], sparse[:n], labels[:n]
                yield dense, sparse, labels
                if n < b:
                    return
        finally:
            reader.close()

    def __repr__(self):
        return (f"Criteo({self.path!r}, {self.batch_size}, share={self.share}"
                f", nshares={self.nshares})")
