"""Lesson 10's checks (activations, the state in bf16, recomputation and what selective keeps, flops per token):
each passes the solution, FAILs on what an untouched exercise leaves, and FAILs on the wrong answers a learner
plausibly writes, naming the fix in one line."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from conftest import fails, untouched, verdict
from scaledl.workshop import checks


def bf16_state_bytes(framework, world_size, stage=0):
    if framework == "ddp":
        return {"params": 4, "grads": 4, "optimizer": 4}
    if framework == "fsdp2":
        return {"params": 4 / world_size, "grads": 4 / world_size, "optimizer": 4 / world_size}
    share = lambda partitioned: 1 / world_size if partitioned else 1  # noqa: E731
    return {"params": 2 * share(stage >= 3), "grads": 2 * share(stage >= 2), "optimizer": 8 * share(stage >= 1)}


def changed(framework, key, value, stage=None):
    """The solution with one part of one framework (at one DeepSpeed stage, or all) replaced by
    `value(world_size, stage)`."""
    def answer(name, world_size, s=0):
        parts = bf16_state_bytes(name, world_size, s)
        if name == framework and (stage is None or s == stage):
            parts[key] = value(world_size, s)
        return parts
    return answer


@pytest.mark.parametrize("wrong, phrase", [
    (changed("ddp", "params", lambda n, s: 2), "stay fp32"),
    (changed("ddp", "params", lambda n, s: 6), "leave out autocast's 16-bit casts"),
    (changed("ddp", "optimizer", lambda n, s: 8), "DDP keeps no separate master copy"),
    (changed("ddp", "grads", lambda n, s: 4 / n), "DDP keeps the whole state on every rank"),
    (changed("deepspeed", "params", lambda n, s: 4 / n if s >= 3 else 4), "in 16 bits: 2 bytes each"),
    (changed("deepspeed", "optimizer", lambda n, s: 4 / n if s >= 1 else 4), "fp32 master copy of the weights"),
    (changed("deepspeed", "grads", lambda n, s: 2 / n, stage=1), "during backward"),
    (changed("deepspeed", "optimizer", lambda n, s: 8, stage=2), "ZeRO-2 partitions the optimizer"),
    (changed("deepspeed", "params", lambda n, s: 2 / n, stage=2), "ZeRO-2 partitions only optimizer, grads"),
    (changed("fsdp2", "params", lambda n, s: 2 / n), "FSDP2's shards stay fp32"),
    (changed("fsdp2", "grads", lambda n, s: 2 / n), "reduce_dtype=fp32"),
    (changed("fsdp2", "optimizer", lambda n, s: 8 / n), "FSDP2 keeps no separate master copy"),
    (changed("fsdp2", "params", lambda n, s: 4), "FSDP2 shards weights"),
])
def test_bf16_state(capsys, wrong, phrase):
    assert checks.check_bf16_state(bf16_state_bytes)
    assert "2 + 2 + (4 + 4)" in verdict(capsys)
    fails(capsys, checks.check_bf16_state(wrong), phrase)


def test_bf16_state_unfinished_or_malformed(capsys):
    fails(capsys, checks.check_bf16_state(None), "not set")
    fails(capsys, checks.check_bf16_state(untouched), "NotImplementedError")
    fails(capsys, checks.check_bf16_state(lambda f, n, s=0: 12), "return a dict")
    # every framework at fp32's bytes: the master copy missed everywhere
    fails(capsys, checks.check_bf16_state(lambda f, n, s=0: {"params": 4, "grads": 4, "optimizer": 4}),
          "DeepSpeed ZeRO-0 on 4 ranks", "2 bytes each")
    # a stage argument that DDP and FSDP2 are not given must not be required
    fails(capsys, checks.check_bf16_state(lambda f, n, s: bf16_state_bytes(f, n, s)), "TypeError")


def activation_bytes(seq_len, batch, width, heads, depth):
    return 4 * seq_len * batch * (16 * width * depth + 2 * width)  # the small terms left out


def test_activation_prediction(capsys):
    assert checks.check_activation_prediction(activation_bytes)
    line = verdict(capsys)
    assert "within 2%" in line and "off by up to" in line
    fails(capsys, checks.check_activation_prediction(untouched), "NotImplementedError")
    fails(capsys, checks.check_activation_prediction(lambda s, b, h, a, d: 4 * s * b * (16 * h + 4 + a)),
          "that is one block")
    fails(capsys, checks.check_activation_prediction(lambda *size: activation_bytes(*size) / 2), "4 bytes a value")
    fails(capsys, checks.check_activation_prediction(
        lambda s, b, h, a, d: activation_bytes(s, b, h, a, d) + d * 4 * a * s * s * b), "no s x s matrix")
    fails(capsys, checks.check_activation_prediction(
        lambda s, b, h, a, d: activation_bytes(s, b, h, a, d) - d * 32 * s * b * h), "4h-wide")
    fails(capsys, checks.check_activation_prediction(lambda s, b, h, a, d: 34 * s * b * h * d), "dropout")
    # attention's row left out, or only its inputs (the output forgotten): the table no longer lists its tensors
    fails(capsys, checks.check_activation_prediction(
        lambda s, b, h, a, d: activation_bytes(s, b, h, a, d) - d * 16 * s * b * h), "attention's row is missing")
    fails(capsys, checks.check_activation_prediction(
        lambda s, b, h, a, d: activation_bytes(s, b, h, a, d) - d * 4 * s * b * h), "keeps its output too")


def test_recompute(capsys):
    assert checks.check_recompute(lambda block, x: checkpoint(block, x, use_reentrant=False))
    said = verdict(capsys)
    assert "keeping nothing but the input" in said and "(width 64, 4 heads, 4 sequences of 32 tokens)" in said
    fails(capsys, checks.check_recompute(untouched), "NotImplementedError")
    fails(capsys, checks.check_recompute(lambda block, x: block(x)), "nothing is recomputed")

    def no_grad(block, x):
        with torch.no_grad():
            return block(x)

    fails(capsys, checks.check_recompute(no_grad), "no graph")

    def half(block, x):  # the attention recomputed, the MLP kept
        x = x + checkpoint(lambda t: block.attention(block.attention_norm(t)), x, use_reentrant=False)
        return x + block.mlp(block.mlp_norm(x))

    fails(capsys, checks.check_recompute(half), "only part of the block")
    fails(capsys, checks.check_recompute(lambda block, x: checkpoint(block, x * 2, use_reentrant=False)),
          "differs from block(x)")
    # x detached on its way in: the weights get gradients, x none.
    fails(capsys, checks.check_recompute(lambda block, x: checkpoint(block, x.detach(), use_reentrant=False)),
          "backward did not reach x")


@pytest.mark.parametrize("wrong, phrase", [
    (lambda h, a: 16 * h + 4 + a, "everything a block keeps"),
    (lambda h, a: h, "full recomputation"),
    (lambda h, a: 10 * h + a, "one h-wide tensor is missing"),
    (lambda h, a: 11 * h, "log-sum-exp"),
    (lambda h, a: 11 * h + a + 4, "statistics are recomputed"),
    (lambda h, a: 7 * h + a, "4h values per token"),
    (lambda h, a: 9 * h + a, "two h-wide tensors are missing"),
    (lambda h, a: 4 * (11 * h + a), "that counts bytes"),
    (lambda h, a: 12 * h + a, "list the outputs"),
])
def test_selective_values(capsys, wrong, phrase):
    assert checks.check_selective_values(lambda h, a: 11 * h + a)
    assert "11h + a" in verdict(capsys)
    fails(capsys, checks.check_selective_values(wrong), phrase)


def test_selective_values_unfinished(capsys):
    fails(capsys, checks.check_selective_values(None), "not set")
    fails(capsys, checks.check_selective_values(untouched), "NotImplementedError")
    fails(capsys, checks.check_selective_values(lambda h, a: "lots"), "return a number")


def flops_per_token(multiplying_params, depth, width, seq_len):
    return 6 * multiplying_params + 12 * depth * width * seq_len


@pytest.mark.parametrize("wrong, phrase", [
    (lambda n, d, w, s: 6 * n, "attention's two s x s products are missing"),
    (lambda n, d, w, s: 2 * n, "backward costs twice the forward"),
    (lambda n, d, w, s: 8 * n + 16 * d * w * s, "recomputed forward is not the model's"),
    (lambda n, d, w, s: 6 * n + 6 * d * w * s, "12, not 6"),
])
def test_flops_per_token(capsys, wrong, phrase):
    assert checks.check_flops_per_token(flops_per_token)
    assert "FlopCounterMode counts the same less 6 for each bias and norm weight" in verdict(capsys)
    fails(capsys, checks.check_flops_per_token(untouched), "NotImplementedError")
    fails(capsys, checks.check_flops_per_token(wrong), phrase)
