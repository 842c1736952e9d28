"""Each check fails on what an untouched or wrong exercise produces and passes on the solution."""
from scaledl import grader


def test_all_reduce_check(capsys):
    assert grader.check_all_reduce([3.0, 3.0], 2)
    assert not grader.check_all_reduce([1.0, 2.0], 2)  # the exercise left untouched
    assert "rank 0 holds 1, expected 3: it still holds its own value" in capsys.readouterr().out
    assert not grader.check_all_reduce([2.0, 2.0], 2)  # MAX instead of SUM


def test_shard_check_names_the_local_rank_mistake(capsys):
    # 2 nodes x 2 ranks sharded by local rank: ranks 0 and 2 get the same samples.
    by_local_rank = [list(range(local, 8, 2)) for local in (0, 1, 0, 1)]
    assert not grader.check_shards(by_local_rank, 8, ranks_per_node=2)
    assert "shard by global rank, not local rank" in capsys.readouterr().out
    assert grader.check_shards([list(range(rank, 8, 4)) for rank in range(4)], 8, ranks_per_node=2)
    assert not grader.check_shards([[0, 2], [1, 3]], 8)  # num_replicas too small


def test_in_sync_check(capsys):
    assert grader.check_in_sync(["abc", "abc"])
    assert not grader.check_in_sync(["abc", "abd"])
    assert "rank 1 holds different parameters than rank 0: wrap the model in DDP" in capsys.readouterr().out
