"""The pipeline rung's schedules on the language model: GPipe, 1F1B and interleaved 1F1B split the model,
not the batch, so each must end where one process with the same batch ends; and the inputs a schedule
cannot take are one line before anything is written."""
import subprocess
import sys

import pytest
import torch

from conftest import tool
from scaledl.ladder import pipeline
from test_equivalence import GPT, assert_same, train

GPT4 = [*GPT, "--depth", "4"]  # 4 blocks: 2 stages of 2, 4 of 1, or 2 ranks x 2 interleaved chunks


@pytest.fixture(scope="module")
def gpt4_reference(tmp_path_factory):
    out = train("python", "single_torch", tmp_path_factory.mktemp("gpt4"), 64, *GPT4, nproc=1)
    return torch.load(out / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.slow
@pytest.mark.parametrize("schedule, ranks, microbatches", [("gpipe", 2, 4), ("1f1b", 2, 4), ("interleaved", 2, 4),
                                                           ("1f1b", 4, 4)])
def test_each_schedule_equals_one_process_with_the_same_batch(tmp_path, gpt4_reference, schedule, ranks,
                                                              microbatches):
    train("torchrun", "pipeline", tmp_path, 64, *GPT4, "--schedule", schedule, "--microbatches", str(microbatches),
          nproc=ranks)
    assert_same(gpt4_reference, torch.load(tmp_path / "model.pt", weights_only=True))


def test_the_stages_split_the_blocks_evenly_and_keep_their_names():
    from scaledl import models

    model = models.gpt(16, 4, 2, 8)
    pieces = pipeline.split_model(model, 4, "gpt")
    assert [[name for name, _ in piece.named_children()] for piece in pieces] == [
        ["embed", "block0"], ["block1"], ["block2"], ["block3", "head"]]
    merged = {k for piece in pieces for k in piece.state_dict()}
    assert merged == set(model.state_dict())


@pytest.mark.parametrize("flags, message", [
    (["--model", "gpt", "--depth", "3", "--schedule", "interleaved"],
     "--depth 3 blocks do not split evenly into 2 pipeline stages"),
    ([], "the pipeline rung splits the CNN in 2 stages"),  # one rank, one stage
    (["--model", "gpt", "--schedule", "zerobubble"], "argument --schedule: invalid choice: 'zerobubble'"),
    (["--model", "gpt", "--microbatches", "3"], "argument --microbatches: must divide --batch-size 64, got 3"),
])
def test_what_a_schedule_cannot_take_is_one_line_and_writes_nothing(tmp_path, flags, message):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "scaledl.ladder.pipeline", *flags, "--out-dir", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not out.exists(), result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.slow
def test_a_schedule_that_needs_more_micro_batches_is_one_line(tmp_path):
    """1F1B on 4 stages with 2 micro batches: torch's own check, said as the rung's line (scaledl launch
    names it last, after torchrun's report), exit 2, nothing written."""
    out = tmp_path / "run"
    result = subprocess.run([tool("scaledl"), "launch", "-n", "4", "--", "scaledl.ladder.pipeline", *GPT4,
                             "--schedule", "1f1b", "--microbatches", "2", "--out-dir", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and not out.exists(), result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "--schedule 1f1b with --microbatches 2 on 4 ranks: Number of microbatches (2)" in last, last


def test_a_torch_without_the_schedule_is_named(monkeypatch):
    monkeypatch.delattr(pipeline.pipelining, "ScheduleInterleaved1F1B")
    with pytest.raises(pipeline.ConfigError, match="--schedule interleaved needs .*ScheduleInterleaved1F1B"):
        pipeline.schedule_class("interleaved")
