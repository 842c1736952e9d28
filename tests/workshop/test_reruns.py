import pytest

from scaledl.workshop import reruns

# Three runs each: 1 rank at 64 samples a step, 2 ranks at 128 samples a step (every rank's samples).
RUNS = {1: [8000.0, 6400.0, 7111.1], 2: [12800.0, 10240.0, 11636.4]}


def test_a_step_is_every_ranks_samples_over_samples_per_s_fastest_first():
    steps = reruns.steps_ms(RUNS, 64)
    assert steps[1] == pytest.approx([8.0, 9.0, 10.0], abs=1e-3)
    assert steps[2] == pytest.approx([10.0, 11.0, 12.5], abs=1e-3)


def test_a_spread_is_the_slowest_run_over_the_fastest_and_each_is_printed(capsys):
    spreads = reruns.show_spreads(reruns.steps_ms(RUNS, 64))
    assert spreads == pytest.approx({1: 0.25, 2: 0.25}, abs=1e-4)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["1 rank, 3 runs: steps of 8.00, 9.00, 10.00 ms, the slowest 25% above the fastest",
                     "2 ranks, 3 runs: steps of 10.00, 11.00, 12.50 ms, the slowest 25% above the fastest"]


@pytest.mark.parametrize("gap_ms, start", [
    (4.4, "inside the runs' spreads (4.50 ms)"),  # 2.0 + 2.5 ms of ranges
    (-4.5, "inside"),
    (5.3, "at the edge of the runs' spreads (4.50 ms), 0.80 ms past"),  # past by under a fifth of 4.5 ms
    (5.5, "beyond the runs' spreads (4.50 ms) by 1.00 ms: the model leaves out a cost"),
    (-5.5, "beyond the runs' spreads (4.50 ms) by 1.00 ms: the model charges more than the run paid"),
])
def test_a_gap_is_judged_against_both_world_sizes_ranges(gap_ms, start):
    assert reruns.gap_verdict(gap_ms, reruns.steps_ms(RUNS, 64)).startswith(start)
