"""What proves that gradients are averaged: k steps on 2 ranks with batch B end at the same
parameters as k steps in one process with batch 2B on the same samples.

The samplers make this exact: with 2 ranks, step i's two micro batches together are the
single process's batch i (see scaledl.sharding).  The tolerance is float32 round-off
grown over 12 steps (a batch of 128 and two of 64 sum in different orders; every rung
lands 1.4e-5 from the reference here); the control test shows that a rung which did not
average (each rank training on its own half) would be 100 times further off.
"""
import glob
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run
from scaledl.hpc import launchers

STEPS = ["--epochs", "1", "--train-limit", "512", "--log-interval", "2"]  # 4 steps of 128 samples


def train(launcher, rung, out_dir, batch_size, *options, nproc=2):
    command = launchers.for_launcher(launcher, nproc, f"scaledl.ladder.{rung}",
                                     ["--out-dir", str(out_dir), "--batch-size", str(batch_size), *STEPS, *options])
    # One thread per rank everywhere: the same summation order in every process's kernels.
    output = run(command, timeout=600, nproc=nproc, env={"OMP_NUM_THREADS": "1"}).stdout
    # Every run ends as a learner's does: the main rank's summary line, and the data-parallel ranks' parameters
    # checked equal (test_ladder.py leans on these runs for the rungs it does not train to 95% again).
    summary = json.loads((Path(out_dir) / "summary.json").read_text())
    assert f"summary rung={rung} world_size={nproc}" in output and summary["world_size"] == nproc
    if nproc > 1 and rung != "pipeline":  # a pipeline's stages hold different layers
        assert summary["params_in_sync"] is True
    return out_dir


def torch_params(out_dir):
    return torch.load(out_dir / "checkpoint.pt", weights_only=True)["model"]


def deepspeed_params(out_dir):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    files = glob.glob(str(out_dir / "checkpoint" / "*" / "zero_pp_rank_0_*optim_states.pt"))
    if files:  # ZeRO 1-3: gather the fp32 partitions every rank wrote
        return get_fp32_state_dict_from_zero_checkpoint(str(out_dir / "checkpoint"))
    (path,) = glob.glob(str(out_dir / "checkpoint" / "*" / "mp_rank_00_model_states.pt"))
    return torch.load(path, weights_only=False)["module"]


TOLERANCE = 1e-5


def max_difference(expected: dict, found: dict) -> float:
    assert expected.keys() == found.keys()
    return max((expected[name].float() - found[name].float()).abs().max().item() for name in expected)


def assert_same(expected: dict, found: dict, atol=TOLERANCE):
    assert expected.keys() == found.keys()
    for name in expected:
        difference = (expected[name].float() - found[name].float()).abs().max().item()
        assert difference <= atol, f"{name}: max difference {difference}"


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory):
    return torch_params(train("python", "single_torch", tmp_path_factory.mktemp("single"), 128, nproc=1))


@pytest.fixture(scope="module")
def tf_reference(tmp_path_factory):
    return train("python", "single_tf", tmp_path_factory.mktemp("single_tf"), 128, nproc=1) / "model.weights.h5"


@pytest.mark.slow
def test_control_one_rank_alone_is_far_from_the_reference(tmp_path, torch_reference):
    # What a rank that skipped the averaging would compute: its own half of each batch.
    alone = torch_params(train("python", "single_torch", tmp_path, 64, "--scale-lr", "false", nproc=1))
    assert max_difference(torch_reference, alone) > 100 * TOLERANCE


# A micro batch of 32 and --grad-accum 2 on 2 ranks is the same global batch of 128: gradient
# accumulation must land where one big batch does (DDP with and without it, the others with it).
ACCUMULATE = ["--grad-accum", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher, rung, batch_size, options", [
    ("torchrun", "ddp", 64, []), ("torchrun", "ddp", 32, ACCUMULATE), ("horovodrun", "horovod_torch", 32, ACCUMULATE),
    ("torchrun", "fsdp", 32, ACCUMULATE)])
def test_data_parallel_torch_equals_one_process(tmp_path, torch_reference, launcher, rung, batch_size, options):
    assert_same(torch_reference, torch_params(train(launcher, rung, tmp_path, batch_size, *options)))


@pytest.mark.slow
def test_one_process_accumulating_equals_one_big_batch(tmp_path, torch_reference):
    assert_same(torch_reference, torch_params(train("python", "single_torch", tmp_path, 32, "--grad-accum", "4",
                                                    nproc=1)))


@pytest.mark.slow
@pytest.mark.parametrize("stage, options", [(0, []), (1, []), (2, ACCUMULATE), (3, ACCUMULATE)])
def test_deepspeed_zero_equals_one_process(tmp_path, torch_reference, stage, options):
    batch_size = 32 if options else 64
    found = deepspeed_params(train("deepspeed", "deepspeed", tmp_path, batch_size, "--zero-stage", str(stage),
                                   *options))
    assert_same(torch_reference, found)


@pytest.mark.slow
def test_pipeline_equals_one_process_with_the_same_batch(tmp_path, torch_reference):
    # Model parallelism splits the model, not the batch: 2 stages with batch 128 and 4
    # micro batches must compute what one process does with batch 128.
    train("torchrun", "pipeline", tmp_path, 128, "--microbatches", "4")
    whole = torch.load(tmp_path / "model.pt", weights_only=True)
    assert_same(torch_reference, whole)
    stage_bytes = json.loads((tmp_path / "summary.json").read_text())["stage_param_bytes"]
    assert 0 < stage_bytes < sum(t.numel() * t.element_size() for t in whole.values())  # rank 0 holds its stage only


# The language model, small: 4 steps of 64 sequences of 32 bytes.
GPT = ["--model", "gpt", "--width", "32", "--depth", "2", "--heads", "2", "--seq-len", "32", "--train-limit", "256"]


@pytest.fixture(scope="module")
def gpt_reference(tmp_path_factory):
    return torch_params(train("python", "single_torch", tmp_path_factory.mktemp("gpt"), 64, *GPT, nproc=1))


@pytest.mark.slow
@pytest.mark.parametrize("rung, recompute", [("ddp", "selective"), ("fsdp", "full")])
def test_the_language_model_recomputed_on_two_ranks_equals_one_process(tmp_path, gpt_reference, rung, recompute):
    # Recomputation reruns the same operations on the same values: it moves no parameter.
    assert_same(gpt_reference, torch_params(train("torchrun", rung, tmp_path, 32, *GPT, "--recompute", recompute)))


@pytest.mark.slow
def test_deepspeed_zero3_recomputing_the_language_model_equals_one_process(tmp_path, gpt_reference):
    # DeepSpeed's own recomputation (checkpointing.checkpoint, each block's input kept in CPU memory)
    # under ZeRO-3's partitioned parameters.
    found = deepspeed_params(train("deepspeed", "deepspeed", tmp_path, 32, *GPT, "--recompute", "full",
                                   "--offload-activations", "--zero-stage", "3"))
    assert_same(gpt_reference, found)


def keras_weights(path):
    import h5py

    with h5py.File(path, "r") as f:
        arrays = {}
        f.visititems(lambda name, item: arrays.__setitem__(name, np.array(item))
                     if isinstance(item, h5py.Dataset) else None)
    return arrays


def assert_same_keras(expected_path, found_path):
    expected, found = keras_weights(expected_path), keras_weights(found_path)
    layers = [name for name in expected if name.startswith("layers/")]  # model.fit also saves optimizer slots
    assert len(layers) == 8 and all(name in found for name in layers)
    for name in layers:
        assert np.abs(expected[name] - found[name]).max() <= TOLERANCE, name


@pytest.mark.slow
@pytest.mark.parametrize("batch_size, options", [(64, []), (64, ["--keras-fit"]), (32, ["--grad-accum", "2"])])
def test_horovod_tf_equals_one_process(tmp_path, tf_reference, batch_size, options):
    # With --grad-accum 2: two micro batches of 32 on each of 2 ranks, their sums averaged once a step.
    assert_same_keras(tf_reference, train("horovodrun", "horovod_tf", tmp_path, batch_size, *options)
                      / "model.weights.h5")


@pytest.mark.slow
def test_one_tensorflow_process_accumulating_equals_one_big_batch(tmp_path, tf_reference):
    found = train("python", "single_tf", tmp_path, 32, "--grad-accum", "4", nproc=1)
    assert_same_keras(tf_reference, found / "model.weights.h5")
