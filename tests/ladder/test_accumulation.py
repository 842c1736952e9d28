"""Gradient accumulation's saving, counted on real ranks: with --grad-accum N the data-parallel rungs
reduce gradients once per optimizer step, not once per micro batch (tests/probes/accumulation_probe.py
counts DDP's bucket all-reduces and FSDP2's reduce-scatters in the rung's own run).  That the result
is the big batch's is tests/ladder/test_equivalence.py's."""

import pytest

from conftest import assert_refused, reports, run
from scaledl.hpc import launchers

# 256 samples, 2 ranks, micro batch 16: 8 micro batches a rank, so 8 steps, or 2 with --grad-accum 4.
FLAGS = ["--epochs", "1", "--train-limit", "256", "--batch-size", "16", "--log-interval", "1"]


def reductions(rung: str, out_dir, grad_accum: int) -> int:
    command = launchers.torchrun(2, "accumulation_probe", [rung, *FLAGS, "--grad-accum", str(grad_accum),
                                                           "--out-dir", str(out_dir)])
    return reports(run(command, timeout=300, env={"OMP_NUM_THREADS": "1"}).stdout)[0]["reductions"]


@pytest.mark.slow
@pytest.mark.parametrize("rung", ["ddp", "fsdp"])
def test_accumulating_reduces_once_a_step(tmp_path, rung):
    every_batch = reductions(rung, tmp_path / "one", 1)
    accumulating = reductions(rung, tmp_path / "four", 4)
    assert every_batch % 8 == 0 and every_batch > 0  # 8 steps, the same count each
    assert accumulating == every_batch // 4  # 2 steps of 4 micro batches: a quarter of the reductions


@pytest.mark.parametrize("flags, message", [
    (["--grad-accum", "0"], "--grad-accum must be > 0, got 0"),
    (["--grad-accum", "2", "--train-limit", "100"], "--batch-size of 64"),  # 100 samples: 1 micro batch, no step
])
def test_an_accumulation_the_data_cannot_fill_is_one_line_and_creates_nothing(tmp_path, flags, message):
    assert_refused("single_torch", flags, tmp_path / "run", message)


@pytest.mark.parametrize("rung, flags, message", [
    ("horovod_tf", ["--grad-accum", "2", "--keras-fit"], "--keras-fit steps once a batch"),
    ("pipeline", ["--grad-accum", "2"], "unrecognized arguments: --grad-accum 2"),
    ("deepspeed", ["--grad-accum", "2", "--on-nonfinite", "skip"], "--on-nonfinite skip skips a micro batch"),
    ("horovod_torch", ["--grad-accum", "2", "--adasum"], "and no --grad-accum"),
])
def test_a_rung_that_cannot_honour_accumulation_says_so(tmp_path, rung, flags, message):
    assert_refused(rung, flags, tmp_path / "run", message)
