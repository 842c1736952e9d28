import sys

import pytest

from scaledl.hpc import launchers
from scaledl.workshop import pipeline_runs


def test_time_stage_gives_a_forward_and_a_backward():
    import torch

    stage = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    forward_s, backward_s = pipeline_runs.time_stage(stage, torch.randn(4, 8), torch.device("cpu"), repeats=4, skip=1)
    assert forward_s > 0 and backward_s > 0
    assert all(p.grad is not None for p in stage.parameters())  # the backward ran through the stage


FAKE_RUNG = """
import json, sys
out_dir = sys.argv[sys.argv.index("--out-dir") + 1]
json.dump({"bubble": 0.25}, open(f"{out_dir}/summary.json", "w"))
json.dump({"events": [[1, 0, 0, "F", 0, 0.0, 1.0]]}, open(f"{out_dir}/pipeline_events.json", "w"))
print("summary rung=pipeline bubble=0.25")
"""


def test_run_rung_reads_back_the_summary_and_the_events(monkeypatch, tmp_path):
    script = tmp_path / "rung.py"
    script.write_text(FAKE_RUNG)
    fake = [sys.executable, str(script)]
    monkeypatch.setattr(launchers, "torchrun", lambda n, module, args: [*fake, *args])
    line, summary, events = pipeline_runs.run_rung(2, ["--epochs", "1"])
    assert line == "summary rung=pipeline bubble=0.25" and summary == {"bubble": 0.25}
    assert events == [[1, 0, 0, "F", 0, 0.0, 1.0]]


def test_run_rung_says_why_it_failed(monkeypatch):
    failing = [sys.executable, "-c", "import sys; sys.exit('no such stage')"]
    monkeypatch.setattr(launchers, "torchrun", lambda n, module, args: failing)
    with pytest.raises(RuntimeError, match="no such stage"):
        pipeline_runs.run_rung(2)


def test_one_f_one_b_draws_the_lessons_schedule():
    assert pipeline_runs.one_f_one_b(2, 3) == (
        "slot:     1   2   3   4   5   6   7   8\n"
        "stage 0:  F0  F1  .   B0  F2  B1  .   B2\n"
        "stage 1:  .   F0  B0  F1  B1  F2  B2  .")
    for stages, microbatches in ((3, 4), (3, 2), (4, 8)):
        rows = [line.split()[2:] for line in pipeline_runs.one_f_one_b(stages, microbatches).splitlines()[1:]]
        for stage, row in enumerate(rows):
            held = peak = 0
            for call in row:
                held += {"F": 1, "B": -1}.get(call[0], 0)
                peak = max(peak, held)
            assert peak == min(microbatches, stages - stage)  # what 1F1B holds, lesson 11's Exercise 4
            calls = [f"{kind}{m}" for kind in "FB" for m in range(microbatches)]
            assert sorted(row) == sorted([*calls, *["."] * (len(row) - len(calls))])  # each call once
        assert len(rows[0]) == 2 * (microbatches + stages - 1)  # fill and drain: S - 1 slots each way
