"""Lessons 6 and 8's arithmetic: DDP's buckets as torch's own reducer builds them, the reading of the
measured timelines, and the stage-2 exercise's check on right and wrong predictions."""
import pytest
import torch
from torch import nn

from scaledl import models
from scaledl.perf import comm_estimate
from scaledl.workshop import checks, plots


def torch_buckets(model, first_cap: int, cap: int) -> list[int]:
    """Bucket bytes from torch's own assignment, over the parameters in reverse order (as a rebuild sees them)."""
    params = [p for p in model.parameters() if p.requires_grad][::-1]
    indices = list(range(len(params)))[::-1]
    buckets, _ = torch.distributed._compute_bucket_assignment_by_size(params, [first_cap, cap], [False] * len(params),
                                                                      indices)
    ordered = [p for p in model.parameters() if p.requires_grad]  # the indices count these
    return [sum(ordered[i].numel() * ordered[i].element_size() for i in bucket) for bucket in buckets]


@pytest.mark.parametrize("width, cap_mb", [(64, 1), (64, None), (16, None), (64, 0.25), (16, 0.01)])
def test_buckets_match_torchs_own_assignment(width, cap_mb):
    model = models.torch_cnn(width=width)
    cap = int((25 if cap_mb is None else cap_mb) * 2**20)
    first = 2**20 if cap_mb is None else cap
    assert [b["bytes"] for b in comm_estimate.ddp_buckets(model, cap_mb)] == torch_buckets(model, first, cap)


def test_the_lessons_cnn_makes_two_buckets_the_first_past_its_cap():
    buckets = comm_estimate.ddp_buckets(models.torch_cnn(width=64), bucket_cap_mb=1)
    assert [b["names"] for b in buckets] == [["9.bias", "9.weight", "7.bias", "7.weight"],
                                             ["3.bias", "3.weight", "0.bias", "0.weight"]]
    assert buckets[0]["bytes"] == 4 * (10 + 1280 + 128 + 6272 * 128) > buckets[0]["cap"] == 2**20
    assert sum(b["bytes"] for b in buckets) == 4 * sum(p.numel() for p in models.torch_cnn(width=64).parameters())


def test_only_the_first_bucket_is_small_by_default_and_frozen_parameters_stay_out():
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])  # 1 MiB + 2 KiB a layer
    model[0].requires_grad_(False)
    buckets = comm_estimate.ddp_buckets(model)
    assert [b["cap"] for b in buckets] == [2**20, 25 * 2**20]
    assert [len(b["names"]) for b in buckets] == [2, 4]  # the last layer alone fills the first bucket
    assert not any(name.startswith("0.") for b in buckets for name in b["names"])


def test_measured_timeline_gives_buckets_in_launch_order_and_the_tail_after_backward():
    events = [("backward", "Linear", 0.0, 0.010), ("backward", "Conv", 0.010, 0.030),
              ("all-reduce", "bucket 1", 0.031, 0.036), ("all-reduce", "bucket 0", 0.002, 0.006)]
    hidden = [("backward", "Linear", 0.0, 0.030), ("all-reduce", "bucket 0", 0.002, 0.006)]
    first, second = comm_estimate.ddp_measured([events, hidden])
    assert first["buckets_s"] == pytest.approx([0.004, 0.005]) and first["backward_s"] == 0.030
    assert first["exposed_s"] == pytest.approx(0.006)
    assert second["exposed_s"] == 0.0


def test_reductions_are_counted_per_window_and_per_phase():
    reduced = [(2, "backward", 800, 1.0), (2, "step", 4, 0.1), (3, "backward", 800, 2.0), (5, "backward", 800, 3.0)]
    assert comm_estimate.reductions_per_window(reduced, 3) == [{"all_reduces": 1, "bytes": 800, "ms": 1.0},
                                                               {"all_reduces": 2, "bytes": 1600, "ms": 5.0}]
    assert comm_estimate.reductions_per_window(reduced, 3, "step")[0]["bytes"] == 4
    with pytest.raises(ValueError, match="at least 1"):
        comm_estimate.reductions_per_window(reduced, 0)


GRAD = 827_688  # lesson 8's CNN: 206,922 fp32 gradients
MEASURED = {"all_reduces": 3, "bytes": 3 * GRAD}


def test_the_measured_window_passes(capsys):
    assert checks.check_window_prediction({"all_reduces": 3, "bytes": 3 * GRAD}, MEASURED, GRAD, 2, 3)
    assert capsys.readouterr().out.startswith("PASS: 3 all-reduces")


def test_an_unset_prediction_is_not_attempted_yet(capsys):
    assert not checks.check_window_prediction(None, MEASURED, GRAD, 2, 3)
    assert capsys.readouterr().out.startswith("NOT ATTEMPTED YET: `stage2_window` is not set")


@pytest.mark.parametrize("predicted, hint", [
    ({"bytes": 3 * GRAD}, "two keys"),
    ({"all_reduces": 1, "bytes": GRAD}, "stages 0 and 1"),
    ({"all_reduces": 24, "bytes": 3 * GRAD}, "one call per bucket"),
    ({"all_reduces": 3, "bytes": 3 * GRAD // 2}, "the call carries the whole bucket"),
    ({"all_reduces": 3, "bytes": GRAD}, "add up the window"),
    ({"all_reduces": 3, "bytes": 8 * 3 * GRAD}, "counts bits"),
    ({"all_reduces": 3, "bytes": 3 * GRAD // 4}, "counts gradients"),
    ({"all_reduces": 3, "bytes": 12345}, "the whole model"),
])
def test_wrong_predictions_fail_with_their_hint(predicted, hint, capsys):
    assert not checks.check_window_prediction(predicted, MEASURED, GRAD, 2, 3)
    out = capsys.readouterr().out
    assert out.startswith("FAIL: ") and hint in out


def test_the_ring_bytes_per_rank_is_a_wrong_answer_on_four_ranks(capsys):
    measured = {"all_reduces": 3, "bytes": 3 * GRAD}
    assert not checks.check_window_prediction({"all_reduces": 3, "bytes": 2 * 3 / 4 * 3 * GRAD}, measured,
                                                     GRAD, 4, 3)
    assert "what the ring sends per rank" in capsys.readouterr().out


def test_no_measurement_fails_even_a_right_prediction(capsys):
    assert not checks.check_window_prediction({"all_reduces": 3, "bytes": 3 * GRAD}, None, GRAD, 2, 3)
    assert "no measurement" in capsys.readouterr().out


def test_prediction_figure_draws_a_bar_pair_per_quantity_and_a_dot_per_rank():
    fig = plots.prediction_figure(["bucket 0", "bucket 1"], [0.004, 0.002], [[0.005, 0.003], [0.007, 0.002]],
                                          "DDP")
    ax = fig.axes[0]
    assert len(ax.patches) == 4
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["bucket 0", "bucket 1"]
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    assert [list(line.get_xdata()) for line in dots] == [pytest.approx([5, 7]), pytest.approx([3, 2])]
    assert ax.patches[1].get_width() == pytest.approx(5)  # the shortest over the ranks


def test_a_rank_that_waited_long_sits_at_the_axis_edge_with_its_value():
    fig = plots.prediction_figure(["bucket 0"], [0.004], [[0.005], [0.090]], "DDP")
    ax = fig.axes[0]
    assert ax.get_xlim()[1] == pytest.approx(1.5 * 5 * 1.02)
    edge = [line for line in ax.lines if line.get_marker() == ">"]
    assert len(edge) == 1 and list(edge[0].get_xdata()) == [pytest.approx(7.5)]
    assert [text.get_text() for text in ax.texts] == ["90 ms"]


def test_the_bucket_exercises_models_match_torchs_own_assignment():
    """The models checks.check_ddp_buckets grades with: the reference is torch's own, names and all."""
    from scaledl.workshop.checks import lesson_06

    for case, model, cap_mb in lesson_06._bucket_models():
        cap = int((25 if cap_mb is None else cap_mb) * 2**20)
        first = 2**20 if cap_mb is None else cap
        assert [b["bytes"] for b in comm_estimate.ddp_buckets(model, cap_mb)] == torch_buckets(model, first, cap), case
