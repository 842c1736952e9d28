"""Give each rank its own part of the data, by GLOBAL rank.

Sharding by local rank is the classic multi-node bug: rank 0 on node 0 and rank 4 on node 1
both have local rank 0, so they train on the same samples and half the data is never seen.

Training uses PyTorch's `DistributedSampler` (call `set_epoch` every epoch, or every epoch
repeats the first one's order) or tf.data's `shard`.  Evaluation must count every sample
exactly once: `DistributedSampler` pads the last shard with repeats so that all ranks get
the same number of batches, which would skew the reported accuracy, so `eval_indices` and
`evaluate_torch` use unpadded strided shards and sum the counts across ranks.

DataLoader workers (`num_workers > 0`) are started with "forkserver", not fork, once MPI is
initialized: a child forked from an MPI process inherits its network registrations
(libfabric on Slingshot, InfiniBand verbs), which can hang a multi-node job in its first
collective or batch; on Polaris it did before ALCF's 2024 OS upgrade (ALCF's "PyTorch on
Polaris" page).  Forkserver workers start from a clean process.
"""
from __future__ import annotations

import sys

import numpy as np

from scaledl.datasets import DataError, Dataset


def eval_indices(num_samples: int, rank: int, world_size: int) -> np.ndarray:
    """Sample indices rank `rank` evaluates: every index in exactly one rank, no padding."""
    return np.arange(rank, num_samples, world_size)


def worker_context(num_workers: int, mpi_initialized: bool | None = None) -> str | None:
    """The multiprocessing start method for DataLoader workers: "forkserver" when MPI is
    initialized in this process (see the module's docstring), else the platform's default."""
    if num_workers == 0:
        return None
    if mpi_initialized is None:
        mpi = sys.modules.get("mpi4py.MPI")
        mpi_initialized = bool(mpi and mpi.Is_initialized() and not mpi.Is_finalized())
    return "forkserver" if mpi_initialized else None


def torch_train_set(data: Dataset):
    """The training images (NCHW, normalized) and labels as a TensorDataset, kept in memory."""
    import torch
    from torch.utils.data import TensorDataset

    x = torch.from_numpy(data.normalized(data.x_train)).permute(0, 3, 1, 2).contiguous()
    return TensorDataset(x, torch.from_numpy(data.y_train))


def torch_train_loader(data: Dataset, batch_size: int, rank: int, world_size: int, seed: int,
                       drop_last: bool = True, num_workers: int = 0):
    """A DataLoader over this rank's shard of the training set (tensors kept in memory).

    `loader.sampler.skip_batches(n)` resumes mid-epoch: the sampler's order is a function of
    (seed, epoch), so skipping the batches already trained gives the uninterrupted run's next one.
    """
    from torch.utils.data import DataLoader, DistributedSampler

    check_enough_data(len(data.y_train), batch_size, world_size)
    dataset = torch_train_set(data)
    # DistributedSampler with num_replicas=1 is a seeded shuffle: one code path for every world size.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=_Resumable(sampler, batch_size), drop_last=drop_last,
                      num_workers=num_workers, multiprocessing_context=worker_context(num_workers))


def check_enough_data(num_samples: int, batch_size: int, world_size: int) -> None:
    """Every rank needs at least one full micro batch per epoch, or the run trains nothing."""
    if num_samples // world_size < batch_size:
        raise DataError(
            f"{num_samples} training samples give each of {world_size} ranks {num_samples // world_size}, "
            f"fewer than one --batch-size of {batch_size}: use more data (--train-limit), a smaller "
            "--batch-size, or fewer ranks")


class _Resumable:
    """Wraps a DistributedSampler: can drop the first batches of the next epoch only."""

    def __init__(self, sampler, batch_size: int):
        self.sampler, self.batch_size, self.skip = sampler, batch_size, 0

    def skip_batches(self, count: int) -> None:
        self.skip = count * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        indices = list(self.sampler)[self.skip:]
        self.skip = 0
        return iter(indices)

    def __len__(self) -> int:
        return len(self.sampler) - self.skip


def torch_test_tensors(data: Dataset, rank: int, world_size: int):
    """This rank's unpadded shard of the test set, as (images NCHW, labels) tensors."""
    import torch

    index = eval_indices(len(data.y_test), rank, world_size)
    x = torch.from_numpy(data.normalized(data.x_test[index])).permute(0, 3, 1, 2).contiguous()
    return x, torch.from_numpy(data.y_test[index])


def evaluate_torch(model, data: Dataset, rank: int, world_size: int, device, batch_size: int = 1000,
                   all_reduce=None) -> tuple[float, float]:
    """(mean loss, accuracy) over the whole test set, each sample counted once across ranks.

    `all_reduce` sums a 1-D tensor across ranks (torch.distributed's by default when a
    process group is up; pass Horovod's for Horovod rungs).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    x, y = torch_test_tensors(data, rank, world_size)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, targets (a model's tokens)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            xb, yb = x[start:start + batch_size].to(device), y[start:start + batch_size].to(device)
            logits = model(xb).float()
            totals += torch.stack([F.cross_entropy(logits, yb, reduction="sum").double(),
                                   (logits.argmax(1) == yb).sum().double(),
                                   torch.tensor(float(yb.numel()), dtype=torch.float64, device=device)])
    model.train()
    if all_reduce is not None:
        totals = all_reduce(totals)
    elif world_size > 1 and dist.is_initialized():
        dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return loss_sum / count, correct / count


def tf_train_dataset(data: Dataset, batch_size: int, rank: int, world_size: int, seed: int, epoch: int = 0):
    """tf.data pipeline over this rank's shard; reshuffled per epoch like `set_epoch` does."""
    import tensorflow as tf

    check_enough_data(len(data.y_train), batch_size, world_size)
    x, y = data.normalized(data.x_train), data.y_train
    order = np.random.default_rng(seed + epoch).permutation(len(y))
    dataset = tf.data.Dataset.from_tensor_slices((x[order], y[order])).shard(world_size, rank)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def evaluate_tf(model, data: Dataset, rank: int, world_size: int, batch_size: int = 1000,
                all_reduce=None) -> tuple[float, float]:
    """evaluate_torch for Keras models; `all_reduce` sums a 1-D tensor across ranks (Horovod's)."""
    import tensorflow as tf

    index = eval_indices(len(data.y_test), rank, world_size)
    x, y = data.normalized(data.x_test[index]), data.y_test[index]
    totals = tf.zeros(3, tf.float64)  # loss sum, correct, count
    for start in range(0, len(y), batch_size):
        logits = tf.cast(model(x[start:start + batch_size], training=False), tf.float32)
        labels = y[start:start + batch_size]
        loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == labels, tf.float64))
        totals += tf.stack([tf.reduce_sum(tf.cast(loss, tf.float64)), correct, float(len(labels))])
    if all_reduce is not None:
        totals = all_reduce(totals)
    loss_sum, correct, count = totals.numpy().tolist()
    return loss_sum / count, correct / count
