"""Choosing a layout (scaledl.perf.choose, `scaledl predict --layouts`): every layout the machine allows and
no other, each one's memory the lessons' arithmetic, the fitting ones ranked by predicted step; bad input is
one line and writes nothing."""
import json
import subprocess

import pytest

from conftest import tool
from scaledl import activations, models, zero_memory
from scaledl.perf import choose, predict

BIG = models.GPT_PRESETS["gpt3-2.7b"]


def test_every_layout_the_machine_allows_and_no_other():
    rows = choose.layouts(BIG, predict.POLARIS, choose.DEVICES["polaris"], 2, 64)
    seen = set()
    for row in rows:
        assert row["dp"] * row["tp"] * row["pp"] == 8
        assert 4 % row["tp"] == 0 and BIG["heads"] % row["tp"] == 0  # inside a node, whole heads
        assert BIG["depth"] % row["pp"] == 0
        assert row["micro_batch_size"] * row["micro_batches"] * row["dp"] == 64
        assert row["zero"] <= 1 or row["pp"] == 1  # DeepSpeed: no ZeRO-2/3 with a pipeline
        assert row["zero"] == 0 or row["dp"] > 1
        key = tuple(row[k] for k in ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size"))
        assert key not in seen
        seen.add(key)
    assert {(r["tp"], r["pp"]) for r in rows} >= {(1, 1), (4, 1), (2, 2), (1, 8), (4, 2)}
    fits = [row["fits"] for row in rows]
    assert fits == sorted(fits, reverse=True)  # the fitting ones first
    fitting = [row["step_s"] for row in rows if row["fits"]]
    assert fitting == sorted(fitting)


def test_a_layouts_memory_is_the_state_and_the_activations_the_lessons_derive():
    device = choose.DEVICES["polaris"]
    plain = choose.evaluate(BIG, predict.POLARIS, device, 1, 8, dp=4, tp=1, pp=1, stage=0, recompute="none",
                            micro_batch_size=2)
    num_params = models.gpt_num_params(BIG["width"], BIG["depth"], BIG["seq_len"])
    state = 16 * num_params  # bf16 weights and gradients, fp32 master, Adam's two moments: DDP keeps all of it
    # DeepSpeed's bf16 runs the model in bf16, not under autocast: every value kept is 2 bytes, the fp32 count halved,
    # where autocast would keep the residual stream in fp32 and 16-bit copies of the weights besides.
    held = activations.model_bytes(BIG["seq_len"], 2, BIG["width"], BIG["depth"], BIG["heads"], bytes_per_value=2)
    positions = 8 * BIG["seq_len"]  # the position ids, int64 at any precision
    fp32 = activations.model_bytes(BIG["seq_len"], 2, BIG["width"], BIG["depth"], BIG["heads"])
    assert fp32 - positions == 2 * (held - positions)
    assert held < activations.model_bytes(BIG["seq_len"], 2, BIG["width"], BIG["depth"], BIG["heads"], precision="bf16")
    assert plain["memory_gib"] * 2**30 == pytest.approx(state + held, rel=1e-9)
    assert not plain["fits"]  # lesson 11: DDP with Adam does not fit a 40 GB A100
    sharded = choose.evaluate(BIG, predict.POLARIS, device, 1, 8, dp=4, tp=1, pp=1, stage=3, recompute="full",
                              micro_batch_size=2)
    expected = zero_memory.predict(num_params, 4, 3, 2, 2, 12)["total"] + activations.model_bytes(
        BIG["seq_len"], 2, BIG["width"], BIG["depth"], BIG["heads"], "full", bytes_per_value=2)
    assert sharded["memory_gib"] * 2**30 == pytest.approx(expected, rel=1e-9) and sharded["fits"]
    # Split over 4 tensor-parallel ranks: a quarter of the split layers' weights, the rest whole.
    split = choose.params_per_rank(BIG["width"], BIG["depth"], BIG["seq_len"], tp=4, pp=1)
    whole = num_params - models.transformer_sharded_params(BIG["width"], BIG["depth"])
    assert split == pytest.approx(whole + models.transformer_sharded_params(BIG["width"], BIG["depth"]) / 4)
    # A 1F1B stage holds min(m, p) micro batches: 4 stages and 2 micro batches hold 2.
    piped = choose.evaluate(BIG, predict.POLARIS, device, 1, 8, dp=1, tp=1, pp=4, stage=0, recompute="none",
                            micro_batch_size=4)
    one = choose.activation_bytes(BIG["seq_len"], 4, BIG["width"], BIG["depth"] // 4, BIG["heads"], "none", "bf16", 1)
    assert piped["micro_batches"] == 2 and piped["bubble"] == pytest.approx(3 / 5)
    state = zero_memory.predict(round(choose.params_per_rank(BIG["width"], BIG["depth"], BIG["seq_len"], 1, 4)), 1, 0,
                                2, 2, 12)["total"]
    assert piped["memory_gib"] * 2**30 == pytest.approx(state + 2 * one, rel=1e-6)


def test_the_fastest_layout_that_fits_beats_what_does_not_fit_only_by_fitting():
    rows = choose.layouts(BIG, predict.POLARIS, choose.DEVICES["polaris"], 1, 16)
    best = rows[0]
    assert best["fits"] and best["memory_gib"] * 2**30 <= 0.9 * choose.DEVICES["polaris"].memory_bytes
    assert all(row["memory_gib"] * 2**30 > 0.9 * choose.DEVICES["polaris"].memory_bytes
               for row in rows if not row["fits"])
    # Recomputation costs a third more compute: among otherwise equal layouts that both fit, none wins.
    pairs = {}
    for row in rows:
        if row["fits"]:
            pairs.setdefault(tuple(row[k] for k in ("dp", "tp", "pp", "zero", "micro_batch_size")), {})[
                row["recompute"]] = row["step_s"]
    both = [modes for modes in pairs.values() if len(modes) == 2]
    assert both and all(modes["none"] < modes["full"] for modes in both)


def test_zero2_reduces_every_micro_batch_zero1_once_a_step():
    """DeepSpeed's stage 2 all-reduces the gradients in every micro batch's backward, stage 1 at the accumulation
    boundary only: with m micro batches ZeRO-2 pays (m - 1) all-reduces more than ZeRO-1, and with one as much."""
    device = choose.DEVICES["polaris"]

    def row(stage, micro_batch_size):
        return choose.evaluate(BIG, predict.POLARIS, device, 4, 512, dp=16, tp=1, pp=1, stage=stage, recompute="none",
                               micro_batch_size=micro_batch_size)

    held = choose.params_per_rank(BIG["width"], BIG["depth"], BIG["seq_len"], 1, 1)
    one = predict.allreduce_s(2 * held, 16, predict.POLARIS.inter)  # bf16 gradients, one dp ring a node
    for micro_batch_size, m in ((1, 32), (4, 8), (32, 1)):
        zero1, zero2 = row(1, micro_batch_size), row(2, micro_batch_size)
        assert zero2["micro_batches"] == m
        assert zero1["dp_s"] == pytest.approx(one + predict.all_gather_s(2 * held, 16, predict.POLARIS.inter))
        assert zero2["dp_s"] - zero1["dp_s"] == pytest.approx((m - 1) * one, rel=1e-9, abs=1e-12)
    assert row(2, 1)["step_s"] > 1.5 * row(1, 1)["step_s"]  # 32 all-reduces of 5 GB: no longer a tie


def test_the_command_ranks_the_layouts(tmp_path):
    out = tmp_path / "layouts.json"
    result = subprocess.run([tool("scaledl"), "predict", "--layouts", "--system", "polaris", "--model", "gpt:gpt3-2.7b",
                             "--nodes", "4", "--global-batch-size", "512", "--top", "3", "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "16 ranks of A100 SXM4 40GB" in lines[0] and "layouts fit" in lines[0]
    assert len(lines) == 1 + 2 + 3  # the headline, the table's header and rule, three layouts
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["fits"] and len(rows) > 100
    assert lines[3].split()[:3] == [str(rows[0]["dp"]), str(rows[0]["tp"]), str(rows[0]["pp"])]


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt:tiny", "--nodes", "1", "--global-batch-size", "8", "--alpha-us", "1", "--bandwidth-gbps", "1"],
     "--layouts needs --system"),
    (["--system", "polaris", "--model", "cnn", "--nodes", "1", "--global-batch-size", "8"], "gpt:PRESET"),
    (["--system", "polaris", "--model", "gpt:tiny", "--nodes", "1", "2", "--global-batch-size", "8"], "one node count"),
    (["--system", "polaris", "--model", "gpt:tiny", "--nodes", "1"], "--global-batch-size"),
    (["--system", "polaris", "--model", "gpt:tiny", "--nodes", "1", "--global-batch-size", "8", "--step-ms", "3"],
     "leave out --step-ms"),
    (["--system", "polaris", "--model", "gpt:tiny", "--nodes", "1", "--global-batch-size", "8", "--strategy", "ddp"],
     "leave out --strategy"),
    (["--system", "polaris", "--model", "gpt:tiny", "--nodes", "1", "--global-batch-size", "8", "--mfu", "1.5"],
     "--mfu"),
])
def test_layouts_bad_input_is_one_line_and_writes_nothing(tmp_path, argv, message):
    out = tmp_path / "out" / "layouts.json"
    result = subprocess.run([tool("scaledl"), "predict", "--layouts", *argv, "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not out.parent.exists()


def test_the_layout_flags_without_layouts_are_refused(tmp_path):
    result = subprocess.run([tool("scaledl"), "predict", "--system", "polaris", "--model", "gpt:tiny", "--step-ms", "3",
                             "--global-batch-size", "8"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--global-batch-size go with --layouts" in result.stderr, result.stderr


@pytest.mark.slow
def test_the_chooser_is_checked_against_the_rungs_here(tmp_path):
    """`scaledl bench layouts`: every layout predicted by the chooser from this machine's measured rate and link,
    and run by its rung; the suite's ranks and correlation are the rows' own."""
    from scaledl.perf.bench import layouts

    done = subprocess.run([tool("scaledl"), "bench", "layouts", "--quick", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    data = json.loads((tmp_path / "layouts.json").read_text())
    assert done.returncode == 0 and "error" not in data, data.get("traceback", done.stderr[-2000:])
    rows = data["rows"]
    assert {row["rung"] for row in rows} == {"ddp", "deepspeed", "tensor_parallel", "pipeline"}
    assert [row["layout"] for row in rows] == [layouts.label(layout) for layout in layouts.layouts(2, True)]
    link = predict.Link(data["link"]["alpha_s"], data["link"]["bandwidth_Bps"], overlaps=data["link"]["overlaps"])
    system = predict.System("here", 2, link, link)
    device = choose.Device("here", 2**40, data["device"]["rate_flops"], "")
    for row in rows:
        # The prediction is the chooser's own, from the recorded rate and link (both rounded to 4 digits).
        again = choose.evaluate(layouts.SIZES, system, device, 1, layouts.GLOBAL_BATCH_SIZE, row["dp"], row["tp"],
                                row["pp"], row["zero"], row["recompute"], row["micro_batch_size"], precision="fp32",
                                mfu=1.0, tp_allreduces_per_block=6)
        assert again["step_s"] * 1e3 == pytest.approx(row["predicted_ms"], rel=2e-3)
        assert row["measured_ms"] > 0 and row["ratio"] == pytest.approx(row["predicted_ms"] / row["measured_ms"],
                                                                        rel=2e-3)
        assert (row["tp_ms"] > 0) == (row["tp"] > 1) and (row["pp_ms"] > 0) == (row["pp"] > 1)
        assert (row["dp_ms"] > 0) == (row["dp"] > 1)
    for key in ("predicted", "measured"):
        order = sorted(rows, key=lambda row: row[f"{key}_ms"])
        assert [row[f"{key}_rank"] for row in order] == list(range(1, len(rows) + 1))
    assert data["rho"] == pytest.approx(layouts.spearman([r["predicted_ms"] for r in rows],
                                                         [r["measured_ms"] for r in rows]))
    fastest = min(r["measured_ms"] for r in rows)
    pick = min(rows, key=lambda r: r["predicted_ms"])
    assert data["pick_cost"] == pytest.approx(pick["measured_ms"] / fastest - 1, abs=1e-3)
    assert f"headline: {data['headline']['text']}" in done.stdout and (tmp_path / "layouts.png").stat().st_size > 0


def test_spearman_counts_orders_not_values():
    from scaledl.perf.bench.layouts import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 400]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)


def test_pairs_in_order_counts_pairs_the_runs_keep():
    from scaledl.perf.bench.layouts import pairs_in_order

    rows = [{"predicted_ms": p, "measured_ms": m} for p, m in ((21.9, 18.5), (18.9, 20.9), (42.4, 68.9))]
    assert pairs_in_order(rows) == (2, 3)  # lesson 14's run: dp and pp swapped, tp last in both
    assert pairs_in_order(rows[:1]) == (0, 0)
    assert pairs_in_order([{**row, "measured_ms": row["predicted_ms"]} for row in rows]) == (3, 3)
