"""What psd's data sets (criteo.py's Criteo, stream.py's StreamDir) share:
their base class (a torch IterableDataset when torch is there, else a plain
iterable), the check of batch_size/share/nshares, and the part of a share
that one DataLoader worker process reads."""
try:  # a torch Dataset when torch is there, else a plain iterable
    from torch.utils.data import IterableDataset as Base
    from torch.utils.data import get_worker_info as _worker_info
except ImportError:  # pragma: no cover - torch is optional
    Base = object
    _worker_info = None


def check(batch_size, share, nshares):
    """Raises ValueError naming the argument unless batch_size is a whole
    number >= 1 and 0 <= share < nshares are whole numbers."""
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size: want a whole number >= 1, got "
                         f"{batch_size!r}")
    if int(nshares) != nshares or nshares < 1 or \
            int(share) != share or not 0 <= share < nshares:
        raise ValueError(f"share {share!r} of nshares {nshares!r}: want "
                         f"0 <= share < nshares")


def of_loader(share, nshares):
    """(share, nshares) for this process: in a DataLoader with k > 1
    workers, worker w reads share + w * nshares of nshares * k, so the k
    processes read the share between them, each its own part."""
    info = _worker_info() if _worker_info else None
    if info is not None and info.num_workers > 1:
        return share + info.id * nshares, nshares * info.num_workers
    return share, nshares
