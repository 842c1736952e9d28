import numpy as np
import pytest
import torch

from conftest import PROBES, reports, run, tool
from scaledl.metrics import History, plot_history, read_jsonl, summarize


def test_cross_rank_reduction_of_known_values():
    # rows: loss_sum, correct, samples, steps, seconds
    rows = np.array([[10.0, 60, 100, 10, 2.0],
                     [30.0, 80, 100, 10, 4.0]])
    result = summarize(rows)
    assert result["loss"] == pytest.approx(0.2) and result["accuracy"] == pytest.approx(0.7)
    assert result["samples"] == 200
    assert result["samples_per_s"] == pytest.approx(50 + 25)
    assert result["samples_per_s_per_rank"] == pytest.approx(37.5)
    assert (result["step_time_min"], result["step_time_max"]) == pytest.approx((0.2, 0.4))
    assert result["step_time_mean"] == pytest.approx(0.3)


def test_history_jsonl_round_trips(tmp_path):
    history = History(tmp_path, config={"lr": 0.1}, run_info={"rung": "test"})
    for step in range(1, 7):
        history.step(torch.tensor(2.0 * step), torch.tensor(3), batch_size=4)
        if step % 3 == 0:
            history.log(step, step / 6, lr=0.1)
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert lines[0]["type"] == "config" and lines[0]["config"] == {"lr": 0.1} and lines[0]["run"]["rung"] == "test"
    assert [r["step"] for r in lines[1:]] == [3, 6]
    assert lines[1]["loss"] == pytest.approx((2 + 4 + 6) / 12) and lines[2]["accuracy"] == pytest.approx(0.75)
    assert lines[1:] == history.records
    assert plot_history(tmp_path / "metrics.jsonl").stat().st_size > 1000


@pytest.mark.slow
def test_history_reduces_across_two_real_ranks(tmp_path):
    result = run([tool("torchrun"), "--standalone", "--nproc_per_node=2", str(PROBES / "metrics_probe.py"),
                  str(tmp_path)])
    found = reports(result.stdout)
    assert found[0]["record"]["samples"] == 2 * 5 * 8
    # rank r adds loss 1+r and 2+r correct per step: means over both ranks are known.
    assert found[0]["record"]["loss"] == pytest.approx((1 + 2) * 5 / 80)
    assert found[0]["record"]["accuracy"] == pytest.approx((2 + 3) * 5 / 80)
    assert found[0]["record"]["step_time_max"] >= found[0]["record"]["step_time_min"]
    assert found[1]["record"] is None  # only rank 0 records and writes
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 2


def test_tensorboard_events_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    history = History(tmp_path, tensorboard=True)
    for step in range(1, 5):
        history.step(torch.tensor(1.0 / step), torch.tensor(2), batch_size=4)
        history.log(step)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("loss")] == [1, 2, 3, 4]
    assert events.Scalars("loss")[-1].value == pytest.approx(0.25 / 4)
