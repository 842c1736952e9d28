"""scaledl.workshop.step_profile: lesson 2's profile summed by kind, its gap split and the A100 ceiling."""
import math
from types import SimpleNamespace

import pytest
import torch

from scaledl.workshop import step_profile


def event(key, self_us):
    return SimpleNamespace(key=key, self_cpu_time_total=self_us)


EVENTS = [event("aten::max_pool2d_with_indices", 40.0), event("aten::convolution_backward", 20.0),
          event("aten::mkldnn_convolution", 10.0), event("aten::mm", 10.0), event("aten::addmm", 5.0),
          event("Optimizer.step#SGD.step", 5.0), event("aten::relu", 10.0),
          event("ProfilerStep*", 1000.0)]  # not an operator's row: left out


def test_self_time_by_kind_sums_the_operators_rows_only():
    total, share = step_profile.self_time_by_kind(EVENTS, "self_cpu_time_total")
    assert total == 100.0
    assert share == pytest.approx({"convolutions (forward and backward)": 0.3, "pooling": 0.4,
                                   "matrix multiplies": 0.15, "optimizer step": 0.05})


def test_gap_split_divides_the_self_time_per_step(capsys):
    total, share = step_profile.self_time_by_kind(EVENTS, "self_cpu_time_total")
    profile = step_profile.StepProfile(EVENTS, "self_cpu_time_total", total * 1000, share, 5,  # 100 ms in 5 steps
                                       table_us=110e3)  # the table's total also counts rows that are not operators
    split = step_profile.gap_split(profile, flops=0.9e9, throughput=100e9, predicted_s=0.009)
    assert split["flop_ops_s"] == pytest.approx(0.009) and split["other_s"] == pytest.approx(0.011)
    assert split["rate"] == pytest.approx(100e9)
    out = capsys.readouterr().out
    assert "per step: the operators' rows 20.00 ms, the table's total 22.00 ms" in out
    assert "convolutions and matrix multiplies: 9.00 ms per step at 100.0 GFLOP/s, 100% of the large matmul's " \
           "rate" in out
    assert "all other operators: 11.00 ms of the profiled step's 20.00 ms, for 0 counted FLOPs: the larger part of " \
           "its gap" in out  # 11 ms against the products' 0 ms over their 9 ms floor
    assert len(out.splitlines()) == 3 and max(len(line) for line in out.splitlines()) < 120  # short lines


def test_gap_split_names_the_products_when_they_hold_more_of_the_gap(capsys):
    events = [event("aten::mkldnn_convolution", 80.0), event("aten::relu", 20.0)]
    total, share = step_profile.self_time_by_kind(events, "self_cpu_time_total")
    profile = step_profile.StepProfile(events, "self_cpu_time_total", total * 1000, share, 5)  # 20 ms a step
    split = step_profile.gap_split(profile, flops=0.2e9, throughput=100e9, predicted_s=0.002)
    assert split["flop_ops_s"] == pytest.approx(0.016) and split["other_s"] == pytest.approx(0.004)
    out = capsys.readouterr().out  # the products: 16 ms against a 2 ms floor; the rest: 4 ms
    assert "all other operators: 4.00 ms of the profiled step's 20.00 ms, for 0 counted FLOPs; the products, slower " \
           "than the large matmul, hold more of its gap" in out


def test_gap_split_sets_the_stopwatch_beside_the_operators_rows(capsys):
    total, share = step_profile.self_time_by_kind(EVENTS, "self_cpu_time_total")
    profile = step_profile.StepProfile(EVENTS, "self_cpu_time_total", total * 1000, share, 5)  # 20 ms a step
    step_profile.gap_split(profile, flops=0.9e9, throughput=100e9, predicted_s=0.009, measured_s=0.025)
    above = capsys.readouterr().out
    assert "per step: the operators' rows 20.00 ms, the stopwatch without the profiler 25.00 ms\n" in above
    step_profile.gap_split(profile, flops=0.9e9, throughput=100e9, predicted_s=0.009, measured_s=0.016)
    below = capsys.readouterr().out
    assert "the stopwatch without the profiler 16.00 ms\n" in below
    for out in (above, below):  # the numbers only: the lesson's markdown says why the readings differ
        assert len(out.splitlines()) == 3 and max(len(line) for line in out.splitlines()) < 120


def test_rest_growth_reads_the_range_both_batches_runs_allow(capsys):
    ms = 1e-3
    result = step_profile.rest_growth([3.38 * ms, 3.65 * ms, 2.66 * ms], [14.76 * ms, 16.35 * ms, 11.58 * ms], 4,
                                      where="this CPU")
    assert result["growth"] == pytest.approx(14.76 / 3.38) and result["low"] == pytest.approx(11.58 / 3.65)
    assert result["high"] == pytest.approx(16.35 / 2.66)  # the slowest at 256 over the fastest at 64
    out = capsys.readouterr().out
    assert out == ("the rest grew 4.4x for 4x the batch (the runs allow 3.2x to 6.1x): on this CPU, work per sample: "
                   "the hypothesis fails\n")  # one line
    verdict = {  # where the range lies against 1x and 4x
        "a fixed cost per step: the hypothesis holds": ([1.0, 1.1], [0.9, 1.2]),
        "partly fixed, partly per sample: the hypothesis holds in part": ([1.0, 1.1], [2.0, 2.5]),
        "work per sample, slower at the larger batch: the hypothesis fails": ([1.0, 1.1], [5.0, 6.0]),
        "too noisy to tell a fixed cost from work per sample": ([1.0, 4.0], [3.0, 4.5]),
    }
    for expected, (small, large) in verdict.items():
        assert step_profile.rest_growth(small, large, 4)["verdict"] == expected
    # A median inside a row is not enough: the range decides (a median of 4x whose runs reach 0.9x is too noisy).
    assert step_profile.rest_growth([1.0, 1.0, 4.5], [3.9, 4.0, 4.1], 4)["verdict"].startswith("too noisy")
    assert step_profile.rest_growth([1.0, -0.1], [4.0, 4.0], 4)["verdict"] == "no rest"


def test_profile_steps_can_profile_without_printing(capsys):
    x = torch.randn(4, 4, requires_grad=True)
    profile = step_profile.profile_steps(lambda: (x @ x).sum().backward(), torch.device("cpu"), 2, show=False)
    assert capsys.readouterr().out == "" and any(event.key == "aten::mm" for event in profile.events)


def test_a100_ceiling_takes_the_peak_each_kind_is_allowed(capsys):
    counts = {"aten.convolution_backward": 0.2457e9, "aten.convolution": 0.1301e9, "aten.mm": 0.0517e9,
              "aten.addmm": 0.0259e9}
    at_peak_s = step_profile.a100_ceiling(counts, 64, {"convolutions": True, "matrix multiplies": False})
    assert math.isclose(at_peak_s, 0.3758e9 / 156e12 + 0.0776e9 / 19.5e12)
    assert "a ceiling of about 10 M samples/s" in capsys.readouterr().out  # as lesson 2 says
    all_fp32 = step_profile.a100_ceiling(counts, 64, {"convolutions": False, "matrix multiplies": False})
    assert math.isclose(all_fp32, sum(counts.values()) / 19.5e12)


def test_profile_steps_profiles_a_real_step(capsys):
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 1, 8, 8)

    def step():
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    profile = step_profile.profile_steps(step, torch.device("cpu"), num_steps=2)
    assert profile.sort_by == "self_cpu_time_total" and profile.total_us > 0
    assert all(profile.share[kind] > 0 for kind in step_profile.KINDS)
    assert sum(profile.share.values()) <= 1 + 1e-9
    assert "operators' CPU self time by kind" in capsys.readouterr().out
    assert profile.table_us == pytest.approx(sum(event.self_cpu_time_total for event in profile.events))
    assert profile.table_us >= profile.total_us  # the table also counts autograd's rows


def test_table_total_on_a_gpu_sums_the_device_rows_only():
    from torch.autograd import DeviceType

    rows = [SimpleNamespace(key="aten::mm", device_type=DeviceType.CPU, self_device_time_total=30.0),
            SimpleNamespace(key="ampere_sgemm", device_type=DeviceType.CUDA, self_device_time_total=30.0)]
    assert step_profile.table_total(rows, "self_device_time_total") == 30.0


def test_lesson_2s_run_calls_are_the_rungs():
    """Lesson 2 cuts the rung's loop to the run object's four calls (on its deeper page, or in the lesson): each must
    be a line the rung runs, in order."""
    import json

    from conftest import ROOT, lesson_and_deeper

    rung = (ROOT / "src" / "scaledl" / "ladder" / "single_torch.py").read_text()
    markdown = ["".join(cell["source"]) for page in lesson_and_deeper("02_single_device")
                for cell in json.loads(page.read_text())["cells"] if cell["cell_type"] == "markdown"]
    box = next(text for text in markdown if "run = harness.TorchRun(" in text)
    snippet = box.split("```python\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in snippet.splitlines()]
    lines = [line for line in lines if line and line != "..."]
    assert len(lines) == 5
    position = 0
    for line in lines:
        position = rung.index(line, position) + len(line)  # ValueError: not in the rung, or out of order
