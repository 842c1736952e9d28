import numpy as np
import pytest
import torch

from conftest import PROBES, reports, run, tool
from scaledl import load_dataset, models, sharding
from scaledl.datasets import synthetic


def epoch_indices(loader, epoch):
    loader.sampler.set_epoch(epoch)
    return list(loader.sampler)


def test_two_ranks_see_every_sample_once_per_epoch():
    data = synthetic(num_train=1000)
    loaders = [sharding.torch_train_loader(data, 10, rank, 2, seed=0) for rank in (0, 1)]
    for epoch in (0, 1):
        shards = [epoch_indices(loader, epoch) for loader in loaders]
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(1000))
    assert epoch_indices(loaders[0], 0) != epoch_indices(loaders[0], 1)  # set_epoch reshuffles


def test_shards_follow_global_rank_not_local_rank():
    # Two nodes of two ranks: global ranks 0..3. Ranks 0 and 2 share local rank 0 but not data.
    data = synthetic(num_train=400)
    shards = [set(epoch_indices(sharding.torch_train_loader(data, 10, rank, 4, seed=0), 0)) for rank in range(4)]
    assert all(not shards[i] & shards[j] for i in range(4) for j in range(i + 1, 4))
    assert set().union(*shards) == set(range(400))


def test_resume_skips_exactly_the_trained_batches():
    data = synthetic(num_train=200)
    loader = sharding.torch_train_loader(data, 10, 0, 2, seed=3)
    full = epoch_indices(loader, 4)
    loader.sampler.skip_batches(3)
    assert epoch_indices(loader, 4) == full[30:]
    assert epoch_indices(loader, 4) == full  # only the next epoch is shortened


def test_eval_indices_cover_odd_sizes_without_padding():
    shards = [sharding.eval_indices(2001, rank, 2) for rank in (0, 1)]
    assert len(shards[0]) + len(shards[1]) == 2001
    assert sorted(np.concatenate(shards).tolist()) == list(range(2001))


def test_tf_shard_by_rank():
    data = synthetic(num_train=64)
    labels = [np.concatenate([y.numpy() for _, y in sharding.tf_train_dataset(data, 4, rank, 2, seed=0)])
              for rank in (0, 1)]
    assert len(labels[0]) == len(labels[1]) == 32


@pytest.mark.slow
def test_two_rank_evaluation_equals_single_process():
    data = load_dataset()
    torch.manual_seed(0)
    model = models.for_dataset(data)
    expected_loss, expected_accuracy = sharding.evaluate_torch(model, data, 0, 1, torch.device("cpu"))
    found = reports(run([tool("torchrun"), "--standalone", "--nproc_per_node=2", str(PROBES / "eval_probe.py")]).stdout)
    assert [r["shard"] for r in found] == [1000, 1000]
    for report in found:
        assert report["accuracy"] == pytest.approx(expected_accuracy, abs=1e-12)
        assert report["loss"] == pytest.approx(expected_loss, rel=1e-6)
