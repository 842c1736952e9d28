"""Activation memory and recomputation: what the forward leaves for the backward, counted live
against the formula (scaledl.activations), and recomputation changing memory but not the math."""
import json
import subprocess
import sys

import pytest
import torch

from conftest import assert_refused, reports, run
from scaledl import activations, models
from scaledl.hpc import launchers

SIZES = [(32, 5, 64, 3, 4), (128, 2, 128, 2, 8), (17, 3, 96, 4, 6)]  # seq_len, batch, width, depth, heads


@pytest.mark.parametrize("recompute", models.RECOMPUTE)
@pytest.mark.parametrize("seq_len, batch, width, depth, heads", SIZES)
def test_the_forward_holds_what_the_formula_says(recompute, seq_len, batch, width, depth, heads):
    torch.manual_seed(0)
    model = models.gpt(width, depth, heads, seq_len, recompute=recompute)
    held, logits = activations.held_by_forward(model, torch.randint(0, 256, (batch, seq_len)))
    assert held == activations.model_bytes(seq_len, batch, width, depth, heads, recompute)
    assert logits.requires_grad  # the graph (and what it holds) is alive while counted


@pytest.mark.slow
def test_a_tensor_parallel_rank_holds_what_the_formula_says_and_less_with_sequence_parallelism():
    """Two ranks split the language model as the tensor-parallel rung does; each rank's forward leaves
    the formula's bytes: the norm regions whole on every rank, or cut by tokens with --sequence-parallel."""
    found = reports(run(launchers.torchrun(2, "sp_activation_probe", []), timeout=300).stdout)
    assert [r["rank"] for r in found] == [0, 1] and found[0]["held"] == found[1]["held"]
    assert len(found[0]["held"]) == 8  # two sizes, recompute none and full, with and without
    for case in found[0]["held"]:
        seq_len, batch, width, depth, heads = case["sizes"]
        expected = activations.model_bytes(seq_len, batch, width, depth, heads, case["recompute"], tp=2,
                                           sequence_parallel=case["sequence_parallel"])
        assert case["bytes"] == expected, case
    held = {(tuple(c["sizes"]), c["recompute"], c["sequence_parallel"]): c["bytes"] for c in found[0]["held"]}
    for (sizes, recompute, sequence_parallel), held_bytes in held.items():
        if sequence_parallel:  # the block's input, the sum after attention, the norms' statistics: half
            seq_len, batch, width, depth, _ = sizes
            saved = depth * 4 * seq_len * batch * ((2 * width + 4) / 2 if recompute == "none" else width / 2)
            assert held[sizes, recompute, False] - held_bytes == saved


def test_the_split_formulas_reduce_to_one_rank_and_refuse_what_they_do_not_count():
    for recompute in ("none", "full"):
        whole = activations.block_bytes(32, 4, 64, 4, recompute)
        assert activations.block_bytes(32, 4, 64, 4, recompute, tp=1, sequence_parallel=True) == whole
    # At tp = 4: (12h + a)/4 of the split layers and 4h + 4 whole, per token (4 bytes a value).
    assert activations.block_bytes(32, 4, 64, 4, tp=4) == 4 * 32 * 4 * (4 * 64 + 4 + (12 * 64 + 4) / 4)
    with pytest.raises(ValueError, match="fp32 with recompute none or full"):
        activations.block_bytes(32, 4, 64, 4, "selective", tp=2)
    with pytest.raises(ValueError, match="fp32 with recompute none or full"):
        activations.block_bytes(32, 4, 64, 4, precision="bf16", tp=2)


def test_the_block_knows_the_recompute_modes_the_flags_offer():
    from scaledl import layers

    assert tuple(layers.CHECKPOINT_OPTIONS) == models.RECOMPUTE
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        layers.Block(8, 2, recompute="half")


@pytest.mark.parametrize("recompute", models.RECOMPUTE)
@pytest.mark.parametrize("seq_len, batch, width, depth, heads", SIZES)
def test_under_autocast_the_forward_holds_what_the_formula_says(recompute, seq_len, batch, width, depth, heads):
    torch.manual_seed(0)
    model = models.gpt(width, depth, heads, seq_len, recompute=recompute)
    with torch.autocast("cpu", torch.bfloat16):
        held, _ = activations.held_by_forward(model, torch.randint(0, 256, (batch, seq_len)))
    assert held == activations.model_bytes(seq_len, batch, width, depth, heads, recompute, precision="bf16")
    # bf16 keeps 5/8 of fp32's activations, not half: the residual stream and the norms stay fp32
    if recompute == "none":
        per_block = [activations.block_bytes(seq_len, batch, width, heads, precision=p) for p in ("bf16", "fp32")]
        assert 0.6 < per_block[0] / per_block[1] < 0.65


def test_one_block_holds_the_formula_less_its_input():
    block = models.gpt(64, 1, 4, 32).block0
    held, _ = activations.held_by_forward(block, torch.randn(5, 32, 64, requires_grad=True))
    assert held == activations.block_bytes(32, 5, 64, 4) - 4 * 5 * 32 * 64  # the input is the caller's


def test_the_count_sees_a_tensor_kept_by_the_graph_and_not_one_freed():
    weight = torch.nn.Parameter(torch.randn(8, 8))

    def keeps(x):  # tanh keeps its output (4 * 3 * 8 bytes) for its backward; the product is freed
        return (x @ weight).tanh().sum()

    def keeps_nothing(x):
        return (x @ weight).sum()  # the product's backward needs x and the weight, both excluded

    x = torch.randn(3, 8, requires_grad=True)
    module_keeps, module_frees = torch.nn.Module(), torch.nn.Module()
    module_keeps.forward, module_frees.forward = keeps, keeps_nothing
    module_keeps.w = module_frees.w = weight
    assert activations.held_by_forward(module_keeps, x)[0] == 4 * 3 * 8
    assert activations.held_by_forward(module_frees, x)[0] == 0


def test_recomputation_saves_memory_and_changes_no_gradient():
    tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    grads, held = {}, {}
    for recompute in models.RECOMPUTE:
        torch.manual_seed(0)
        model = models.gpt(64, 3, 4, 32, recompute=recompute)
        held[recompute], logits = activations.held_by_forward(model, tokens)
        torch.nn.functional.cross_entropy(logits, tokens).backward()
        grads[recompute] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert held["full"] < held["selective"] < held["none"]
    for recompute in ("selective", "full"):
        assert (grads[recompute] - grads["none"]).abs().max() <= 1e-6


def test_a_rung_trains_the_language_model_and_reports_tokens_and_mfu(tmp_path):
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", "--model", "gpt", "--width", "32",
                    "--heads", "2", "--depth", "1", "--seq-len", "32", "--recompute", "selective", "--max-steps", "6",
                    "--log-interval", "2", "--batch-size", "8", "--out-dir", str(out)],
                   check=True, capture_output=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    # samples_per_s is rounded to 0.1 and tokens_per_s comes from the unrounded rate: 32 x 0.05 apart at most
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 32, abs=32 * 0.05 + 0.05)
    flops = models.gpt_flops_per_token(32, 1, 32)
    assert summary["mfu"] == pytest.approx(summary["tokens_per_s"] * flops / (summary["peak_tflops"] * 1e12), rel=0.01,
                                           abs=1e-4)  # the summary rounds both
    assert 0 < summary["mfu"] < 1 and "measured fp32 matmul" in summary["peak_source"]
    assert 0 < summary["test_accuracy"] < 1  # per byte predicted, over the held-out files


@pytest.mark.parametrize("rung, flag", [("single_tf", "--recompute")])
def test_a_rung_that_trains_the_cnn_only_refuses_recomputation(tmp_path, rung, flag):
    assert_refused(rung, [flag, "full"], tmp_path / "run", f"unrecognized arguments: {flag} full")


def test_full_blocks_recompute_through_the_function_a_rung_gives():
    """`layers.use_checkpoint`, as the DeepSpeed rung passes DeepSpeed's checkpoint: every full block
    runs through the function (here torch's reentrant one, which DeepSpeed's CheckpointFunction
    follows), holds what the formula says and gives the gradients of no recomputation."""
    from torch.utils.checkpoint import checkpoint

    from scaledl import layers

    calls, runs = [], []

    def counted(run, x):
        calls.append(x.shape)
        return checkpoint(lambda t: runs.append(1) or run(t), x, use_reentrant=True)

    seq_len, batch, width, depth, heads = SIZES[0]
    tokens = torch.randint(0, 256, (batch, seq_len))
    grads = {}
    for recompute in ("none", "full"):
        torch.manual_seed(0)
        model = models.gpt(width, depth, heads, seq_len, recompute=recompute)
        assert layers.use_checkpoint(model, counted) == (depth if recompute == "full" else 0)
        if recompute == "full":
            held, _ = activations.held_by_forward(model, tokens)
            assert held == activations.model_bytes(seq_len, batch, width, depth, heads, "full")
            assert len(calls) == depth
        model(tokens).float().logsumexp(1).mean().backward()
        grads[recompute] = [p.grad for p in model.parameters()]
    assert len(calls) == 2 * depth  # the counted forward and the trained one
    assert len(runs) == 3 * depth  # and the trained one's rerun in backward
    for plain, recomputed in zip(grads["none"], grads["full"]):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True])
def test_the_deepspeed_rung_recomputes_through_deepspeeds_checkpoint(tmp_path, offload):
    """--recompute full on the DeepSpeed rung: every block of every training forward goes through
    deepspeed.checkpointing.checkpoint, configured from the rung's config (inputs to CPU memory with
    --offload-activations, partitioned into one piece: there are no tensor-parallel ranks)."""
    from conftest import reports, run
    from scaledl.hpc import launchers

    depth, steps = 2, 3
    args = ["--model", "gpt", "--width", "32", "--depth", str(depth), "--heads", "2", "--seq-len", "16",
            "--train-limit", "256", "--batch-size", "8", "--max-steps", str(steps), "--recompute", "full",
            "--zero-stage", "3", "--out-dir", str(tmp_path / "run"), *(["--offload-activations"] if offload else [])]
    found = reports(run(launchers.deepspeed(2, "ds_checkpoint_probe", args), timeout=300).stdout)
    assert len(found) == 2
    for report in found:
        assert report["calls"] == depth * steps  # evaluation runs without gradients: no checkpoint there
        assert report["cpu_checkpoint"] is offload and report["partition_activations"] is offload
