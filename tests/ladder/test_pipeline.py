"""The pipeline rung's schedules on the language model: GPipe, 1F1B and interleaved 1F1B split the model,
not the batch, so each must end where one process with the same batch ends; and the inputs a schedule
cannot take are one line before anything is written."""
import json
import subprocess

import pytest
import torch

from conftest import assert_refused, tool
from scaledl import pipeline_events
from scaledl.ladder import pipeline
from test_equivalence import GPT, assert_same, train

GPT4 = [*GPT, "--depth", "4"]  # 4 blocks: 2 stages of 2, 4 of 1, or 2 ranks x 2 interleaved chunks


def counted_samples(out_dir) -> tuple[int, int]:
    """(the samples the run's metrics counted, its steps): what its samples_per_s is made of."""
    logs = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    logs = [record for record in logs if record.get("type") == "log"]
    return sum(record["samples"] for record in logs), logs[-1]["step"]


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
    # What each stage held at most, in micro batches, from its own events: GPipe all of them, 1F1B at most
    # p - stage (its warm-up forwards, then one backward for each forward).
    summary = json.loads((tmp_path / "summary.json").read_text())
    peaks = [int(n) for n in summary["peak_in_flight"].split(",")]
    if schedule == "gpipe":
        assert peaks == [microbatches] * ranks
    elif schedule == "1f1b":
        assert peaks == [min(ranks - stage, microbatches) for stage in range(ranks)]
    else:  # two chunks a rank, 2p virtual stages: each holds fewer than GPipe's m
        assert len(peaks) == 2 * ranks and max(peaks) < 2 * microbatches
    chunks = 2 if schedule == "interleaved" else 1
    assert summary["bubble_predicted"] == round(pipeline_events.predicted_bubble(ranks, microbatches, chunks), 4)
    assert 0 < summary["bubble"] < 1
    events = json.loads((tmp_path / "pipeline_events.json").read_text())["events"]
    steps = {event[0] for event in events}
    assert len(events) == len(steps) * 2 * microbatches * ranks * chunks  # a forward and a backward each
    # samples_per_s counts each batch once, whole: the last stage alone sees the loss, and counts all 64
    samples, trained_steps = counted_samples(tmp_path)
    assert samples == trained_steps * 64


@pytest.mark.slow
def test_two_pipelines_side_by_side_equal_one_process_with_both_batches(tmp_path, gpt4_reference):
    """--dp 2 on 4 ranks: 2 pipelines of 2 stages, each on its half of the data (batch 32), the stages'
    gradients averaged across the pipelines: where one process with batch 64 ends."""
    train("torchrun", "pipeline", tmp_path, 32, *GPT4, "--dp", "2", "--schedule", "1f1b", nproc=4)
    assert_same(gpt4_reference, torch.load(tmp_path / "model.pt", weights_only=True))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["peak_in_flight"] == "2,1"  # the first pipeline's stages
    samples, trained_steps = counted_samples(tmp_path)
    assert samples == trained_steps * 2 * 32  # each pipeline's last stage counts its own batch, whole


@pytest.mark.slow
def test_a_stopped_pipeline_resumes_exactly_where_it_stopped(tmp_path):
    """Interleaved on 2 ranks (two chunks each): stopped after 3 steps of 8 and resumed, it ends on the very
    parameters of the run that never stopped.  The checkpoint holds the whole model by name (it loads into
    one process's model) and each parameter's momentum; a resume with other data-parallel replicas is refused."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    options = [*GPT4, "--schedule", "interleaved", "--epochs", "2"]
    train("torchrun", "pipeline", whole, 64, *options)
    train("torchrun", "pipeline", stopped, 64, *options, "--max-steps", "3")
    assert torch.load(stopped / "checkpoint.pt", weights_only=False)["step"] == 3
    train("torchrun", "pipeline", stopped, 64, *options, "--resume")
    ended, resumed = (torch.load(out / "checkpoint.pt", weights_only=False) for out in (whole, stopped))
    assert ended["step"] == resumed["step"] == 8
    assert all(torch.equal(ended["model"][name], resumed["model"][name]) for name in ended["model"])
    assert ended["optimizer"]["state_by_name"].keys() == ended["model"].keys()  # every parameter's momentum
    from scaledl import models

    models.gpt(32, 4, 2, 32).load_state_dict(ended["model"])  # the whole model, as one process holds it
    before = (stopped / "checkpoint.pt").read_bytes()
    result = subprocess.run([tool("torchrun"), "--standalone", "--nproc_per_node=2", "-m", "scaledl.ladder.pipeline",
                             *options, "--batch-size", "64", "--dp", "2", "--out-dir", str(stopped), "--resume"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "replicas 1 (now 2)" in result.stderr, result.stderr[-2000:]
    assert (stopped / "checkpoint.pt").read_bytes() == before


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
    (["--model", "gpt", "--dp", "0"], "argument --dp: must divide the 1 ranks into equal pipelines, got 0"),
])
def test_what_a_schedule_cannot_take_is_one_line_and_writes_nothing(tmp_path, flags, message):
    assert_refused("pipeline", flags, tmp_path / "run", message)


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
    assert "--schedule 1f1b with --microbatches 2 on 4 stages: Number of microbatches (2)" in last, last


def test_a_torch_without_the_schedule_is_named(monkeypatch):
    monkeypatch.delattr(pipeline.pipelining, "ScheduleInterleaved1F1B")
    with pytest.raises(pipeline.ConfigError, match="--schedule interleaved needs .*ScheduleInterleaved1F1B"):
        pipeline.schedule_class("interleaved")


def test_the_bubble_and_the_peak_read_from_events():
    """Two stages, two micro batches, GPipe's order with unit times: stage 0 runs F0 F1 at 0-2, waits, B1 B0
    at 4-6; stage 1 F0 F1 at 1-3, B1 B0 at 3-5.  The step spans 0-6: each stage busy 4 of 6."""
    events = [[1, 0, 0, "F", 0, 0, 1], [1, 0, 0, "F", 1, 1, 2], [1, 1, 1, "F", 0, 1, 2], [1, 1, 1, "F", 1, 2, 3],
              [1, 1, 1, "B", 1, 3, 4], [1, 1, 1, "B", 0, 4, 5], [1, 0, 0, "B", 1, 4, 5], [1, 0, 0, "B", 0, 5, 6]]
    assert pipeline_events.bubble(events) == pytest.approx(1 / 3)
    assert [pipeline_events.peak_in_flight(events, stage) for stage in (0, 1)] == [2, 2]
    assert pipeline_events.predicted_bubble(2, 2) == pytest.approx(1 / 3)
    assert pipeline_events.predicted_bubble(4, 8, chunks_per_rank=2) == pytest.approx(3 / 19)


def test_compute_only_removes_the_waits_for_sends():
    """The events above with every send costing half a unit (stage 1 starts F0 at 1.5, ...): the measured bubble
    grows; replayed with free sends, the schedule's own 1/3 comes back, and each event keeps its length."""
    events = [[1, 0, 0, "F", 0, 0, 1], [1, 0, 0, "F", 1, 1, 2], [1, 1, 1, "F", 0, 1.5, 2.5],
              [1, 1, 1, "F", 1, 2.5, 3.5], [1, 1, 1, "B", 1, 3.5, 4.5], [1, 1, 1, "B", 0, 4.5, 5.5],
              [1, 0, 0, "B", 1, 5, 6], [1, 0, 0, "B", 0, 6, 7]]
    assert pipeline_events.bubble(events) > 0.4
    replayed = pipeline_events.compute_only(events)
    assert pipeline_events.bubble(replayed) == pytest.approx(1 / 3)
    assert sorted(e[6] - e[5] for e in replayed) == sorted(e[6] - e[5] for e in events)
    # Unequal stages keep a bubble of their own: stage 1 twice as slow.
    slow = [[*e[:5], e[5], e[5] + (2 if e[1] == 1 else 1) * (e[6] - e[5])] for e in events]
    assert pipeline_events.bubble(pipeline_events.compute_only(slow)) > 1 / 3
    with pytest.raises(ValueError, match="waits on itself"):  # a backward before its forward
        pipeline_events.compute_only([[1, 0, 0, "B", 0, 0, 1], [1, 0, 0, "F", 0, 1, 2]])


def test_the_handoffs_are_the_time_the_replay_removes():
    """The same events: each send costs half a unit, once on each rank (stage 1's F0, stage 0's B1); stage 1's
    F1 and stage 0's B0 wait for their own rank, not for a send.  The step is 7 units as it ran, 6 replayed."""
    sent = [[1, 0, 0, "F", 0, 0, 1], [1, 0, 0, "F", 1, 1, 2], [1, 1, 1, "F", 0, 1.5, 2.5],
            [1, 1, 1, "F", 1, 2.5, 3.5], [1, 1, 1, "B", 1, 3.5, 4.5], [1, 1, 1, "B", 0, 4.5, 5.5],
            [1, 0, 0, "B", 1, 5, 6], [1, 0, 0, "B", 0, 6, 7]]
    assert pipeline_events.handoff_seconds(sent) == pytest.approx(0.5)
    assert pipeline_events.step_seconds(sent) == pytest.approx(7)
    assert pipeline_events.step_seconds(pipeline_events.compute_only(sent)) == pytest.approx(6)
    assert pipeline_events.handoff_seconds(pipeline_events.compute_only(sent)) == 0
    # A second step whose sends cost 2 units on rank 0: the first step (set-up) is left out, and the larger
    # rank's sum is taken.
    slow = [[2, r, st, k, m, a + 10, b + 10] for _, r, st, k, m, a, b in sent]
    slow = [[*e[:5], e[5] + 1.5, e[6] + 1.5] if e[1] == 0 and e[3] == "B" else e for e in slow]
    assert pipeline_events.handoff_seconds([*sent, *slow]) == pytest.approx(2)
    assert pipeline_events.handoff_seconds([*sent, *slow], skip_first=False) == pytest.approx(1.25)
