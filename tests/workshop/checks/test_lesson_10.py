"""Lesson 10's checks (memory by part, activations, recomputation, flops per token): each passes the solution,
FAILs on what an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming
the fix in one line."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from conftest import fails, untouched, verdict
from scaledl.workshop import checks


def state_bytes(num_params, optimizer):
    return 4 * num_params * (2 + {"sgd": 1, "adam": 2}[optimizer])


def test_state_bytes(capsys):
    assert checks.check_state_bytes(state_bytes)
    assert "12 bytes a parameter" in verdict(capsys)
    fails(capsys, checks.check_state_bytes(None), "not set")
    fails(capsys, checks.check_state_bytes(untouched), "NotImplementedError")
    fails(capsys, checks.check_state_bytes(lambda n, o: 4 * n), "parameters alone")
    fails(capsys, checks.check_state_bytes(lambda n, o: 8 * n), "missing")
    fails(capsys, checks.check_state_bytes(lambda n, o: 16 * n if o == "sgd" else 16 * n), "one buffer")
    fails(capsys, checks.check_state_bytes(lambda n, o: 3 * n if o == "sgd" else 4 * n), "values, not bytes")
    fails(capsys, checks.check_state_bytes(lambda n, o: "lots"), "return a number of bytes")


def activation_bytes(seq_len, batch, width, heads, depth):
    return 4 * seq_len * batch * (16 * width * depth + 2 * width)  # the small terms left out


def test_activation_prediction(capsys):
    assert checks.check_activation_prediction(activation_bytes)
    assert "within 2%" in verdict(capsys)
    fails(capsys, checks.check_activation_prediction(untouched), "NotImplementedError")
    fails(capsys, checks.check_activation_prediction(lambda s, b, h, a, d: 4 * s * b * (16 * h + 4 + a)),
          "that is one block")
    fails(capsys, checks.check_activation_prediction(lambda *size: activation_bytes(*size) / 2), "4 bytes a value")
    fails(capsys, checks.check_activation_prediction(
        lambda s, b, h, a, d: activation_bytes(s, b, h, a, d) + d * 4 * a * s * s * b), "no s x s matrix")
    fails(capsys, checks.check_activation_prediction(
        lambda s, b, h, a, d: activation_bytes(s, b, h, a, d) - d * 32 * s * b * h), "4h-wide")
    fails(capsys, checks.check_activation_prediction(lambda s, b, h, a, d: 34 * s * b * h * d), "dropout")


def test_recompute(capsys):
    assert checks.check_recompute(lambda block, x: checkpoint(block, x, use_reentrant=False))
    assert "keeping nothing but the input" in verdict(capsys)
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
