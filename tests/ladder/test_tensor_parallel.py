"""Tensor parallelism and 2D parallelism: the rungs compute what one process computes, and each rank
holds the share of the parameters the arithmetic says.

Tensor parallelism splits the model, not the batch: 2 tp ranks with batch 128 must end where one
process with batch 128 ends; the 2D rung on a 2 x 2 mesh (dp x tp) with batch 64 per row, where one
process with batch 128 ends (the rows' two batches together are its batch, as for DDP).  The control
leaves out the all-reduce after the row-wise layers and lands hundreds of tolerances away.
"""
import json
import os
import subprocess

import pytest

from conftest import PROBES, assert_refused, run, tool
from scaledl import meshes, models
from scaledl.hpc import jobs, launchers
from test_equivalence import GPT, STEPS, TOLERANCE, gpt_reference, max_difference, torch_params, train  # noqa: F401

WIDTH, DEPTH, HEADS, SEQ_LEN = 64, 2, 4, 32
SMALL = ["--width", str(WIDTH), "--depth", str(DEPTH), "--heads", str(HEADS), "--seq-len", str(SEQ_LEN)]


def state_bytes(out_dir) -> int:
    return json.loads((out_dir / "summary.json").read_text())["state_bytes_per_rank"]


def held_per_rank(tp: int, dp: int = 1) -> float:
    """Parameters, gradients and SGD's momentum: three copies of the rank's parameter bytes."""
    return 3 * meshes.param_bytes_per_rank(WIDTH, DEPTH, SEQ_LEN, tp, dp)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = train("python", "single_torch", tmp_path_factory.mktemp("single"), 128, "--model", "transformer", *SMALL,
                nproc=1)
    assert state_bytes(out) == held_per_rank(1) == 3 * 4 * models.transformer_num_params(WIDTH, DEPTH, SEQ_LEN)
    return torch_params(out)


@pytest.mark.slow
def test_tensor_parallel_equals_one_process_and_holds_half_the_split_layers(tmp_path, reference):
    found = torch_params(train("torchrun", "tensor_parallel", tmp_path, 128, *SMALL))
    print(f"tensor_parallel: max difference {max_difference(reference, found):.2e}")
    assert max_difference(reference, found) <= TOLERANCE
    assert state_bytes(tmp_path) == held_per_rank(tp=2)


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--sequence-parallel"]])
def test_fsdp_tp_on_a_2x2_mesh_equals_one_process(tmp_path, reference, options):
    found = torch_params(train("torchrun", "fsdp_tp", tmp_path, 64, "--tp", "2", *SMALL, *options, nproc=4))
    print(f"fsdp_tp {' '.join(options)}: max difference {max_difference(reference, found):.2e}")
    assert max_difference(reference, found) <= TOLERANCE
    assert state_bytes(tmp_path) == held_per_rank(tp=2, dp=2)


@pytest.fixture(scope="module")
def tp_gpt(tmp_path_factory):
    # The rungs train the classifier by default (lesson 10's measurements are of it); --model gpt splits the
    # language model's blocks the same way, its embeddings and head whole on every rank.
    return torch_params(train("torchrun", "tensor_parallel", tmp_path_factory.mktemp("tp_gpt"), 64, *GPT,
                              "--recompute", "full"))


@pytest.mark.slow
def test_the_language_model_split_over_2_ranks_and_recomputed_equals_one_process(tp_gpt, gpt_reference):  # noqa: F811
    print(f"tensor_parallel, gpt: max difference {max_difference(gpt_reference, tp_gpt):.2e}")
    assert max_difference(gpt_reference, tp_gpt) <= TOLERANCE


@pytest.mark.slow
def test_sequence_parallelism_trains_what_tensor_parallelism_trains(tmp_path, tp_gpt, gpt_reference):  # noqa: F811
    # The norms on half the tokens each, the row-wise layers reduce-scattered: the same arithmetic, the same
    # parameters (the norms' weights, whose gradients each rank computes from its own tokens, included).
    found = torch_params(train("torchrun", "tensor_parallel", tmp_path, 64, *GPT, "--sequence-parallel"))
    print(f"sequence parallel, gpt: max difference {max_difference(tp_gpt, found):.2e} from tensor parallel, "
          f"{max_difference(gpt_reference, found):.2e} from one process")
    assert max_difference(tp_gpt, found) <= TOLERANCE and max_difference(gpt_reference, found) <= TOLERANCE
    assert json.loads((tmp_path / "summary.json").read_text())["params_in_sync"] is True


@pytest.mark.slow
def test_control_without_the_row_wise_all_reduce_is_far_off(tmp_path, reference):
    command = [tool("torchrun"), "--standalone", "--nproc_per_node=2", str(PROBES / "tp_without_allreduce.py"),
               "--out-dir", str(tmp_path), "--batch-size", "128", *STEPS, *SMALL]
    output = run(command, timeout=600, env={"OMP_NUM_THREADS": "1"}).stdout
    print(f"control: max difference {max_difference(reference, torch_params(tmp_path)):.2e}")
    assert max_difference(reference, torch_params(tmp_path)) > 100 * TOLERANCE
    assert "params_in_sync=False" in output  # the ranks' whole layers (norms, embeddings) drift apart


@pytest.mark.slow
def test_tensor_parallel_runs_with_its_summary_checkpoint_and_resume(tmp_path):
    """The short run: two ranks, the summary line, a checkpoint of whole tensors, and --resume from it."""
    options = ["--epochs", "2", "--train-limit", "256", "--log-interval", "2", *SMALL]
    first = train("torchrun", "tensor_parallel", tmp_path, 64, *options, "--max-steps", "4")
    assert torch_params(first)["block0.mlp.up.weight"].shape == (4 * WIDTH, WIDTH)  # gathered, not a shard
    command = [tool("torchrun"), "--standalone", "--nproc_per_node=2", "-m", "scaledl.ladder.tensor_parallel",
               "--out-dir", str(tmp_path), "--batch-size", "64", *options, "--resume"]
    output = run(command, timeout=300, env={"OMP_NUM_THREADS": "1"}).stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "summary rung=tensor_parallel world_size=2" in output and summary["params_in_sync"] is True
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "log"]
    assert steps == [2, 4, 6, 8]  # 4 steps, then the 4 left after the resume
    assert summary["state_bytes_per_rank"] == held_per_rank(tp=2)


# Rank 0 of a 2-rank job as torchrun starts it: refused before it joins the group (no peer ever comes).
TWO_RANKS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "29400"}


@pytest.mark.parametrize("rung, argv, env, message", [
    ("tensor_parallel", ["--model", "cnn"], {}, "tensor parallelism splits a transformer's layers"),
    ("fsdp_tp", ["--tp", "3"], {}, "--tp must divide the 1 ranks into equal groups, got 3"),
    ("tensor_parallel", ["--sequence-parallel", "--seq-len", "33"], TWO_RANKS,
     "--sequence-parallel: --seq-len 33 must be a multiple of the 2 tensor-parallel ranks"),
    ("fsdp_tp", ["--sequence-parallel", "--tp", "2", "--model", "gpt", "--seq-len", "15"], TWO_RANKS,
     "--sequence-parallel: --seq-len 15 must be a multiple of the 2 tensor-parallel ranks"),
])
def test_a_split_that_cannot_work_is_one_line_before_anything_starts(tmp_path, rung, argv, env, message):
    assert_refused(rung, argv, tmp_path / "run", message, env)


def test_the_arithmetic_splits_only_the_block_layers():
    whole = 4 * models.transformer_num_params(WIDTH, DEPTH, SEQ_LEN)
    split = 4 * models.transformer_sharded_params(WIDTH, DEPTH)
    assert meshes.param_bytes_per_rank(WIDTH, DEPTH, SEQ_LEN, tp=4) == whole - split + split / 4
    assert meshes.param_bytes_per_rank(WIDTH, DEPTH, SEQ_LEN, tp=2, dp=2) == (whole - split / 2) / 2


@pytest.mark.slow
@pytest.mark.parametrize("rung, nproc, options", [("tensor_parallel", 2, []), ("fsdp_tp", 4, ["--tp", "2"])])
def test_a_nan_on_one_rank_stops_every_rank_of_the_mesh(tmp_path, rung, nproc, options):
    """The guard reads each rank's shard of the gradients and all-reduces the norm: every rank stops at
    the same step, naming it and the last good checkpoint (tests/probes/fault_probe.py injects the NaN)."""
    env = launchers.local_env(nproc, {**os.environ, "FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "3"})
    env["PYTHONPATH"] = os.pathsep.join([str(PROBES), env.get("PYTHONPATH", "")])
    command = launchers.torchrun(nproc, "fault_probe", [f"scaledl.ladder.{rung}", *SMALL, *options, "--epochs", "1",
                                                        "--train-limit", "512", "--checkpoint-every", "2",
                                                        "--timeout", "30", "--out-dir", str(tmp_path)])
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0
    for rank in range(nproc):
        assert (f"non-finite gradients at step 3 on rank {rank}" in result.stderr
                and f"last good checkpoint {tmp_path / 'checkpoint.pt'}" in result.stderr), result.stderr[-3000:]


@pytest.mark.parametrize("system, ranks_per_node, tp", [("polaris", 4, 4), ("aurora", 12, 4), ("slurm", 2, 2)])
def test_job_scripts_keep_tensor_parallelism_inside_a_node(system, ranks_per_node, tp):
    """Polaris: the 4 GPUs of a node (NVLink) split each layer, the nodes are FSDP2's data parallelism;
    Aurora: groups of 4 of a node's 12 tiles (16 heads split 4 ways, not 12)."""
    found = {job.name: job for job in jobs.jobs_for(system, ranks_per_node)}
    assert (found["tensor_parallel"].nodes, found["tensor_parallel"].ppn) == (1, tp)
    two_d = found["fsdp_tp"]
    assert two_d.nodes == 2 and two_d.ppn == ranks_per_node and two_d.target[-2:] == ["--tp", str(tp)]
    assert ranks_per_node % tp == 0  # every tp group within one node (ranks are placed node by node)


@pytest.mark.slow
def test_the_benchmark_times_the_rungs_own_split(tmp_path):
    """scaledl.perf.bench builds the tensor-parallel step from the rung's wrap (the same plan), on 2 real ranks."""
    out = tmp_path / "steps.json"
    run(launchers.torchrun(2, "scaledl.perf.bench.worker", ["steps", "--variant", "tensor_parallel", "--model",
                                                       "transformer:64,2,4,32", "--steps", "2", "--warmup", "1",
                                                       "--out", str(out)]), timeout=300)
    found = json.loads(out.read_text())
    assert found["world_size"] == 2 and len(found["laps"]) == 2
    assert found["num_params"] == models.transformer_num_params(WIDTH, DEPTH, SEQ_LEN)


def test_benchmark_model_names_are_checked():
    from scaledl.perf.bench import variants

    assert variants.transformer_sizes("transformer:64,2,4,32") == {"width": 64, "depth": 2, "heads": 4, "seq_len": 32}
    with pytest.raises(ValueError, match="transformer:WIDTH,DEPTH,HEADS,SEQ_LEN"):
        variants.transformer_sizes("transformer:64,2")
    with pytest.raises(ValueError, match="splits the transformer's layers"):
        variants.build("tensor_parallel", model_name="cnn")
