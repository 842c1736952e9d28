"""`scaledl bench`: the statistics, the predictor, and a real quick run of every suite.

No timing is asserted (targets are reported, not tested): the quick run checks that every
suite ran, that its numbers are sane, and that the markdown page is rendered from its JSON.
"""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run, tool
from scaledl.perf import predict
from scaledl.perf.bench import comm, memory, runner, stats
from scaledl.perf.bench.cli import SUITE_NAMES


def test_ratio_of_medians_brackets_the_true_ratio():
    rng = np.random.default_rng(0)
    slow, fast = 1.1 + 0.01 * rng.standard_normal(200), 1.0 + 0.01 * rng.standard_normal(200)
    interval = stats.ratio_of_medians(slow, fast)
    assert interval["ci_low"] < 1.1 < interval["ci_high"]
    assert stats.converged(interval, 0.01)
    assert not stats.converged({"ratio": 1.0, "ci_low": 0.9, "ci_high": 1.1}, 0.01)


def test_summary_gives_median_and_percentiles():
    s = stats.summary(range(1, 102))
    assert (s["median"], s["n"]) == (51, 101)
    assert s["p10"] == pytest.approx(11) and s["p90"] == pytest.approx(91)


def test_alpha_beta_fit_recovers_latency_and_bandwidth():
    sizes = [4096 * 4**i for i in range(8)]
    seconds = [20e-6 + n / 5e9 for n in sizes]  # 20 us, 5 GB/s
    fit = stats.fit_alpha_beta(sizes, seconds)
    assert fit["alpha_s"] == pytest.approx(20e-6, rel=1e-3)
    assert fit["bandwidth_Bps"] == pytest.approx(5e9, rel=1e-3)


def test_alpha_beta_fit_never_goes_below_zero():
    # Times that fall as the messages grow (noise on shared cores): no negative bandwidth, the sizes did not matter.
    sizes = [4096 * 4**i for i in range(6)]
    falling = [3e-3 - 1e-10 * n for n in sizes]
    fit = stats.fit_alpha_beta(sizes, falling)
    assert fit["beta_s_per_byte"] == 0 and fit["bandwidth_Bps"] == float("inf") and fit["held_at_zero"] == "beta"
    assert min(falling) <= fit["alpha_s"] <= max(falling)
    link = predict.link_from_fit(fit, 2)
    assert predict.allreduce_s(1e6, 2, link) == pytest.approx(2 * link.alpha_s)  # latency only
    # Times through the origin and below it at small sizes: no negative latency, the bandwidth refitted.
    steep = [n / 5e9 - 1e-6 for n in sizes]
    fit = stats.fit_alpha_beta(sizes, [max(t, 1e-9) for t in steep])
    assert fit["alpha_s"] == 0 and fit["held_at_zero"] == "alpha" and fit["bandwidth_Bps"] > 0
    assert stats.fit_alpha_beta(sizes, [20e-6 + n / 5e9 for n in sizes])["held_at_zero"] is None


def test_bus_bandwidth_factors_follow_nccl_tests():
    assert comm.BUS_FACTOR["allreduce"](8) == pytest.approx(1.75)
    assert comm.BUS_FACTOR["allgather"](8) == pytest.approx(0.875)
    assert comm.BUS_FACTOR["broadcast"](8) == 1.0


def test_predictor_matches_the_paper_and_deepspeed():
    rows = memory.predict_table(7_500_000_000, 64)
    assert rows[3]["paper_mixed_adam_GB"] == pytest.approx(1.875)  # the paper's 7.5B on 64 ranks
    assert rows[0]["paper_mixed_adam_GB"] == pytest.approx(120)
    # DeepSpeed's estimator (mixed-precision Adam) keeps 2 + 18/N bytes per parameter at stage 2.
    assert memory.deepspeed_estimate(1000, 4, 2) == 2 * 1000 + 18 * 1000 // 4
    assert memory.deepspeed_estimate(1000, 4, 0) is None


def test_unknown_suite_is_a_one_line_error():
    done = subprocess.run([sys.executable, "-m", "scaledl.cli", "bench", "nope"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("scaledl bench: error:")


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_quick_run_of_every_suite(tmp_path):
    page = tmp_path / "benchmarks.md"
    output = run([tool("scaledl"), "bench", "all", "--quick", "--out-dir", str(tmp_path), "--markdown", str(page)],
                 timeout=600, cwd=ROOT).stdout
    report = json.loads((tmp_path / "bench.json").read_text())
    assert list(report["suites"]) == list(SUITE_NAMES)
    for name, data in report["suites"].items():
        assert "error" not in data, (name, data.get("traceback"))
        assert _finite_positive(data["headline"]["value"]), (name, data["headline"])
        assert data["rows"] and set(data["columns"]) <= set(data["rows"][0]), name
        assert (tmp_path / f"{name}.json").is_file() and (tmp_path / f"{name}.png").stat().st_size > 0
        assert f"headline: {data['headline']['text']}" in output
    overhead = {row["variant"]: row for row in report["suites"]["overhead"]["rows"]}
    assert set(overhead) == {"plain", "ddp", "horovod", "deepspeed"}
    for row in overhead.values():
        assert _finite_positive(row["time_ratio"]) and row["ci_low"] <= row["time_ratio"] <= row["ci_high"]
        assert row["timed_steps"] >= 20
    for row in report["suites"]["scaling"]["rows"]:
        assert _finite_positive(row["efficiency"]) and row["ranks"] == 2
        assert (row["flag"] == "above 1.0") == (row["efficiency"] > 1.0)
    for row in report["suites"]["comm"]["rows"]:
        assert _finite_positive(row["algbw_GBps"]) and _finite_positive(row["busbw_GBps"])
    for row in report["suites"]["memory"]["rows"]:
        assert row["counted_over_predicted"] == pytest.approx(1.0, abs=0.01), row
    assert all(_finite_positive(row["samples_per_s"]) for row in report["suites"]["input"]["rows"])
    # The page is rendered from the JSON, machine included, never typed by hand.
    assert page.read_text() == runner.markdown(report)
    assert report["machine"]["torch"] in page.read_text() and str(report["machine"]["cores"]) in page.read_text()
    # Each suite's output ends with its headline.
    blocks = [block[block.index("== "):] for block in ("\n" + output).split("\n\n") if "\n== " in "\n" + block]
    assert len(blocks) == len(SUITE_NAMES) and all(b.strip().splitlines()[-1].startswith("headline: ") for b in blocks)


def test_copies_side_by_side_time_their_steps_together(tmp_path):
    # Two real one-rank workers: each waits, warm, for the other before timing (the predictor's
    # single-device step with the node full), and each writes its own laps.
    from scaledl.perf.bench.launch import run_together

    results = run_together(2, "steps", ["--variant", "plain", "--steps", 3, "--warmup", 1,
                                        "--micro-batch-size", 8], tmp_path / "plain.json", timeout_s=300)
    assert len(results) == 2 and all(len(r["laps"]) == 3 and r["world_size"] == 1 for r in results)
    assert not (tmp_path / "plain.ready").exists()  # the barrier's files are gone after


def test_a_copy_alone_does_not_wait_forever(tmp_path):
    from scaledl.perf.bench.worker import wait_for_copies

    wait_for_copies(str(tmp_path / "one"), 1, timeout_s=1)
    with pytest.raises(TimeoutError, match="only 1 of 2 copies"):
        wait_for_copies(str(tmp_path / "two"), 2, timeout_s=0.2)
