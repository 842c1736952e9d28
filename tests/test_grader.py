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


def test_deepspeed_config_check(capsys):
    good = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "train_batch_size": 32,
            "gradient_clipping": 0}
    assert grader.check_deepspeed_config([good, good], world_size=2)
    assert not grader.check_deepspeed_config([{**good, "train_batch_size": 16}], world_size=2)
    assert "train_batch_size 16 != micro batch 8 x accumulation 2 x world_size 2" in capsys.readouterr().out
    assert not grader.check_deepspeed_config([{**good, "gradient_clipping": 1.0}], world_size=2)
    assert not grader.check_deepspeed_config(None, world_size=2)  # the exercise left untouched


def test_zero_formula_check(capsys):
    def solution(num_params, world_size, stage):
        return (2 * num_params / (world_size if stage >= 3 else 1) + 2 * num_params / (world_size if stage >= 2 else 1)
                + 12 * num_params / (world_size if stage >= 1 else 1))

    def untouched(num_params, world_size, stage):
        raise NotImplementedError("exercise")

    def forgot_gradients(num_params, world_size, stage):
        return solution(num_params, world_size, min(stage, 1)) if stage < 3 else solution(num_params, world_size, 3)

    assert grader.check_zero_formula(solution)
    assert not grader.check_zero_formula(untouched)
    assert not grader.check_zero_formula(forgot_gradients)
    assert "stage 2 gives" in capsys.readouterr().out


def test_pipeline_check():
    assert grader.check_pipeline([0.0, 0.0])
    assert not grader.check_pipeline([0.0, 0.7])
    assert not grader.check_pipeline([0.0, float("nan")])
    assert not grader.check_pipeline(None)


def test_horovod_sync_check_names_the_missing_half(capsys):
    assert grader.check_horovod_sync([["a", "c"], ["a", "c"]], "tf")
    assert not grader.check_horovod_sync([["a", "c"], ["b", "d"]], "tf")  # no broadcast
    assert "rank 1 holds different weights than rank 0 after the first step: broadcast" in capsys.readouterr().out
    assert not grader.check_horovod_sync([["a", "c"], ["a", "d"]], "tf")  # broadcast, gradients not averaged
    assert "wrap the tape in hvd.DistributedGradientTape" in capsys.readouterr().out
    assert not grader.check_horovod_sync([["a", "c"], ["b", "c"]], "torch")
    assert "before the first step: broadcast rank 0's parameters" in capsys.readouterr().out
    assert not grader.check_horovod_sync([["a", "c"], ["a", "d"]], "torch")
    assert "wrap the optimizer in hvd.DistributedOptimizer" in capsys.readouterr().out
    assert not grader.check_horovod_sync(None, "torch")  # the exercise left untouched


def test_horovod_allreduce_check(capsys):
    assert grader.check_horovod_allreduce([(3.0, 1.5), (3.0, 1.5)], 2)
    assert not grader.check_horovod_allreduce([(1.5, 1.5), (1.5, 1.5)], 2)  # op left at its default
    assert "hvd.allreduce averages unless told otherwise: pass op=hvd.Sum" in capsys.readouterr().out
    assert not grader.check_horovod_allreduce([(3.0, 3.0), (3.0, 3.0)], 2)  # Sum for both
    assert "that is the sum" in capsys.readouterr().out
    assert not grader.check_horovod_allreduce([(1.0, 1.0), (2.0, 2.0)], 2)  # nothing reduced
    assert "it still holds its own value" in capsys.readouterr().out
    assert not grader.check_horovod_allreduce(None, 2)


def test_horovod_sync_check_on_an_unfinished_training_cell(capsys):
    assert not grader.check_horovod_sync([[], []], "tf")  # the exercise raised before the first step ended
    assert "did not finish on every rank" in capsys.readouterr().out
