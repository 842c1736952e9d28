"""scaledl.perf.predict's formulas against hand-computed cases, `scaledl predict` at its boundary, and a
real quick run of `scaledl bench predict` (its numbers' shape, never its accuracy)."""
import json
import math
import subprocess
import sys

import pytest

from conftest import ROOT, reports, run, tool
from scaledl.hpc import launchers
from scaledl.perf import predict

MIB = 2**20
LINK = predict.Link(alpha_s=1e-5, bandwidth_Bps=1e9)
BANDWIDTH_ONLY = predict.Link(alpha_s=0.0, bandwidth_Bps=1e9)


def test_ring_collectives_by_hand():
    # 4 ranks, 1 MB: all-reduce 2*3 alpha + 2*3/4 * 1e6 / 1e9 = 60 us + 1500 us.
    assert predict.allreduce_s(1e6, 4, LINK) == pytest.approx(1.56e-3)
    # Reduce-scatter and all-gather are each half of it: 3 alpha + 3/4 * 1e6 / 1e9.
    assert predict.reduce_scatter_s(1e6, 4, LINK) == pytest.approx(7.8e-4)
    assert predict.all_gather_s(1e6, 4, LINK) == pytest.approx(7.8e-4)
    assert predict.allreduce_s(1e6, 1, LINK) == 0.0 and predict.reduce_scatter_s(0, 4, LINK) == 0.0


def test_zero_volumes_as_deepspeed_runs_them():
    # DeepSpeed's stages 1-2 all-reduce the gradients (2 Psi) and all-gather the parameters (Psi);
    # stage 3 and FSDP2 reduce-scatter (Psi) and gather twice (2 Psi).
    for stage in ("zero1", "zero2"):
        assert predict.exposed_comm_s(stage, 1e6, 4, LINK, 0.0) == pytest.approx(1.56e-3 + 7.8e-4)
    for stage in ("zero3", "fsdp2"):
        assert predict.exposed_comm_s(stage, 1e6, 4, LINK, 0.0) == pytest.approx(3 * 7.8e-4)


def test_zero3_gathers_per_unit_pay_the_latency_per_unit():
    # 4 units: the same bytes, 4 latencies per pass: 7.8e-4 + 2 * 4 * (3 alpha + 3/4 * 2.5e5 / 1e9).
    assert predict.exposed_comm_s("zero3", 1e6, 4, LINK, 0.0, gathers=4) == pytest.approx(7.8e-4 + 8 * 2.175e-4)
    assert predict.exposed_comm_s("zero3", 1e6, 4, BANDWIDTH_ONLY, 0.0, gathers=4) == pytest.approx(
        predict.exposed_comm_s("zero3", 1e6, 4, BANDWIDTH_ONLY, 0.0))


def test_deepspeed_stage3_keeps_what_runs_again_soon_and_small_parameters_whole():
    # Three units in forward order: 200k + 100k elements, 300M, 400M.  The 100k-element parameter is
    # at the 1e5 persistence threshold: whole through forward and backward, gathered after the
    # optimizer step in a collective of its own.
    units = [[200_000, 100_000], [300_000_000], [400_000_000]]
    total = 700_300_000
    # Without prefetch each unit fetches itself.  After unit 0, 700M elements run before its backward
    # comes back, 2 x 700M = 1.4e9 >= 1e9: freed and fetched again in backward; units 1 (2 x 400M
    # between) and 2 (none) stay gathered.
    knobs = predict.deepspeed_zero3_gathers(units, prefetch_bucket=0)
    assert knobs == {"gathers": 3, "gathered": pytest.approx(700_200_000 / total), "regathers": 1,
                     "regathered": pytest.approx(200_000 / total), "persistent": pytest.approx(100_000 / total),
                     "persistent_gathers": 1, "scatters": 2, "norm_allreduces": 1}  # 700.3M / 5e8: 2 buckets
    # With the default 5e7-element prefetch: unit 0 fetches itself, then prefetches unit 1; unit 1
    # prefetches unit 2; unit 2's prefetch runs on through the recorded backward order, past units 2
    # and 1 (still gathered), to unit 0, freed after its forward: fetched again, 4 all-gathers in
    # forward, none in backward.
    knobs = predict.deepspeed_zero3_gathers(units)
    assert (knobs["gathers"], knobs["gathered"], knobs["regathers"]) == (4, pytest.approx(700_400_000 / total), 0)
    # One element more and it is partitioned like the rest.
    assert predict.deepspeed_zero3_gathers([[100_001]])["persistent"] == 0.0
    # With the distance at 0 (and no prefetch) every unit comes back, as the paper counts it.
    every_unit_again = predict.deepspeed_zero3_gathers(units, max_reuse_distance=0, prefetch_bucket=0)
    assert every_unit_again["regathers"] == 3
    assert every_unit_again["regathered"] == pytest.approx(700_200_000 / total)
    # On 2 ranks, 1 GB of gradients, no latency: reduce-scatter 0.5 s; then half a second per whole
    # gather, times the share each pass moves: forward, backward, after the step.
    knobs = predict.deepspeed_zero3_gathers(units, prefetch_bucket=0)
    expected = 0.5 + 0.5 * 700_200_000 / total + 0.5 * 200_000 / total + 0.5 * 100_000 / total
    assert predict.exposed_comm_s("zero3", 1e9, 2, BANDWIDTH_ONLY, 0.0, **knobs) == pytest.approx(expected)
    # Latency once per collective, a ring step each on 2 ranks: 2 reduce-scatters, 3 units forward,
    # 1 backward, 1 after the step, and the norm's all-reduce of 8 bytes (2 ring steps).
    assert predict.exposed_comm_s("zero3", 1e-30, 2, LINK, 0.0, **knobs) == pytest.approx(
        (2 + 3 + 1 + 1 + 2) * 1e-5 + 8 / 1e9)


def test_fsdp2_gathers_each_unit_twice_and_scatters_it_once():
    assert predict.fsdp2_collectives([100, 0, 300]) == {"gathers": 2, "gathered": 1.0, "regathers": 2,
                                                        "regathered": 1.0, "scatters": 2}
    # A root with parameters of its own stays gathered from forward to backward.
    knobs = predict.fsdp2_collectives([100, 300], root_numel=100)
    assert (knobs["gathers"], knobs["regathers"], knobs["regathered"], knobs["scatters"]) == (3, 2, 0.8, 3)
    # 2 ranks, 4 units of 1 MB in all: per unit alpha + 1/2 of its bytes per collective, 3 collectives a unit.
    knobs = predict.fsdp2_collectives([250_000] * 4)
    assert predict.exposed_comm_s("fsdp2", 1e6, 2, LINK, 0.0, **knobs) == pytest.approx(3 * (4 * 1e-5 + 0.5e-3))


# DeepSpeed's stage 3 settings, as the probe's JSON names them, and as deepspeed_zero3_gathers takes them.
ZERO3_SETTINGS = {"stage3_param_persistence_threshold": "persistence_threshold",
                  "stage3_prefetch_bucket_size": "prefetch_bucket", "stage3_max_reuse_distance": "max_reuse_distance",
                  "stage3_max_live_parameters": "max_live", "reduce_bucket_size": "reduce_bucket"}


ZERO3_CASES = {
    "defaults": '{}',  # the prefetch gathers everything in one collective; small parameters persist
    "fetch module by module, free after forward": '{"stage3_param_persistence_threshold": 1000, '
    '"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}',
    "stop prefetching at max_live": '{"stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": '
    '200000, "stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 400000}',
    "keep what comes back within 300k elements": '{"stage3_param_persistence_threshold": 1000, '
    '"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 300000}',
    "the same, prefetching": '{"stage3_param_persistence_threshold": 1000, "stage3_max_reuse_distance": 300000}',
    "a prefetch that stops inside a module": '{"stage3_param_persistence_threshold": 0, '
    '"stage3_prefetch_bucket_size": 100000, "stage3_max_reuse_distance": 0}',
    "small reduce buckets": '{"reduce_bucket_size": 170000}',
}


def test_the_collectives_counted_in_real_steps_are_the_ones_predicted():
    # Real 2-rank steps, every torch.distributed collective counted by phase (tests/probes/
    # collective_count_probe.py).  DeepSpeed's stage 3 on five Linear layers, under settings that
    # move each of its rules; each count is the whole set of collectives of the step.
    found = [r for r in reports(run(launchers.torchrun(2, "collective_count_probe", [
        "zero3", "64,400,400,400,400,64", *ZERO3_CASES.values()]), timeout=300).stdout) if r["rank"] == 0]
    assert len(found) == len(ZERO3_CASES)
    for case, counted in zip(ZERO3_CASES, found):
        knobs = predict.deepspeed_zero3_gathers(counted["units"], backward_order=counted["backward_order"], **{
            ZERO3_SETTINGS[name]: value for name, value in counted["settings"].items()})
        total = sum(map(sum, counted["units"]))
        expected = {"forward all_gather": knobs["gathers"], "backward all_gather": knobs["regathers"],
                    "step all_gather": knobs["persistent_gathers"], "backward reduce_scatter": knobs["scatters"],
                    "step all_reduce": knobs["norm_allreduces"]}
        assert counted["calls"] == {k: v for k, v in expected.items() if v}, (case, knobs)
        numel = counted["numel"]
        assert numel.get("forward all_gather", 0) == pytest.approx(knobs["gathered"] * total), case
        assert numel.get("backward all_gather", 0) == pytest.approx(knobs["regathered"] * total), case
        assert numel.get("step all_gather", 0) == pytest.approx(knobs["persistent"] * total), case
    # The settings do move the counts.
    assert len({json.dumps(r["calls"], sort_keys=True) for r in found}) >= 5
    # FSDP2, as the rung wraps the transformer: each of its 5 layers gathered twice and scattered once.
    counted = reports(run(launchers.torchrun(2, "collective_count_probe", ["fsdp", "transformer:64,2,4,8"]),
                          timeout=300).stdout)[0]
    knobs = predict.fsdp2_collectives(counted["top_level"])
    calls = counted["calls"]
    assert (calls["forward all_gather"], calls["backward all_gather"], calls["backward reduce_scatter"]) == (
        knobs["gathers"], knobs["regathers"], knobs["scatters"]) == (5, 5, 5)
    assert counted["numel"]["forward all_gather"] == sum(counted["top_level"])
    # Tensor parallelism, as the rung splits the transformer (2 blocks, width 64, 8 tokens, micro batch 4):
    # 2 all-reduces a block forward and 4 backward, each of the block's activations.
    counted = reports(run(launchers.torchrun(2, "collective_count_probe", ["tp", "transformer:64,2,4,8"]),
                          timeout=300).stdout)[0]
    knobs = predict.tensor_parallel_collectives(depth=2, micro_batch_size=4, seq_len=8, width=64)
    calls, numel = counted["calls"], counted["numel"]
    assert calls["forward all_reduce"] + calls["backward all_reduce"] == knobs["tp_allreduces"] == 12
    assert (calls["forward all_reduce"], calls["backward all_reduce"]) == (4, 8)
    assert numel["forward all_reduce"] + numel["backward all_reduce"] == 12 * knobs["activation_bytes"] / 4


def test_tensor_parallel_splits_the_compute_and_all_reduces_activations():
    # 2 blocks of width 256 on 32 tokens: split flops 2 x (72 w^2 + 12 L w) = 9,633,792 per token,
    # the head 6 x 256 x 10 = 15,360.
    assert predict.transformer_split_share(256, 2, 32) == pytest.approx(9_633_792 / 9_649_152)
    knobs = predict.tensor_parallel_collectives(depth=2, micro_batch_size=8, seq_len=32, width=256)
    assert knobs == {"tp_allreduces": 12, "activation_bytes": 8 * 32 * 256 * 4}
    # 100 ms, 80% of it split over 2 ranks: 20 + 40 ms; 12 all-reduces of 1 MB, 2 x 10 us + 1 ms each.
    assert predict.predict_step_s("tensor_parallel", 0.1, 0, 2, LINK, split_share=0.8, tp_allreduces=12,
                                  activation_bytes=1e6) == pytest.approx(0.06 + 12 * 1.02e-3)
    # A step already measured per rank (split_share 0) only gains the all-reduces.
    assert predict.predict_step_s("tensor_parallel", 0.1, 0, 2, LINK, split_share=0.0, tp_allreduces=12,
                                  activation_bytes=1e6) == pytest.approx(0.1 + 12 * 1.02e-3)
    # Without its knobs it refuses, rather than predict a split with no communication.
    with pytest.raises(ValueError, match="tp_allreduces"):
        predict.predict_step_s("tensor_parallel", 0.1, 0, 2, LINK, split_share=0.5)
    # Strong scaling: the ideal is 1/N of the step, and the other strategies ignore these knobs.
    rows = predict.table(0.1, 10**6, link=LINK, ranks=(1, 2), strategies=("tensor_parallel", "ddp"),
                         split_share=1.0, tp_allreduces=12, activation_bytes=1e6)
    tp2 = next(r for r in rows if r["strategy"] == "tensor_parallel" and r["ranks"] == 2)
    assert tp2["efficiency"] == pytest.approx(0.05 / (0.05 + 12 * 1.02e-3)) and tp2["comm_ms"] is None
    assert next(r for r in rows if r["strategy"] == "ddp" and r["ranks"] == 2)["comm_ms"] > 0


def test_ddp_buckets_with_and_without_overlap():
    # 60 MiB in 25 MiB buckets: 25, 25, 10 MiB; 2 ranks, no latency: each costs bytes / 1e9 s.
    assert predict.chunks(60 * MIB, 25 * MIB) == [25 * MIB, 25 * MIB, 10 * MIB]
    total, last = 60 * MIB / 1e9, 10 * MIB / 1e9
    assert predict.exposed_comm_s("ddp_no_overlap", 60 * MIB, 2, BANDWIDTH_ONLY, 0.05) == pytest.approx(total)
    # Overlapped: what did not fit under a 50 ms backward (62.9 - 50 ms) beats the last bucket (10.5 ms).
    assert predict.exposed_comm_s("ddp", 60 * MIB, 2, BANDWIDTH_ONLY, 0.05) == pytest.approx(total - 0.05)
    # A 100 ms backward hides all but the last bucket.
    assert predict.exposed_comm_s("ddp", 60 * MIB, 2, BANDWIDTH_ONLY, 0.1) == pytest.approx(last)
    # The default backward share is 2/3 of the step: 90 ms -> 60 ms of backward, 2.9 ms left over < last.
    assert predict.predict_step_s("ddp", 0.09, 60 * MIB, 2, BANDWIDTH_ONLY) == pytest.approx(0.09 + last)


def test_recomputation_adds_a_forward_and_accumulation_reduces_once():
    busy = predict.Link(alpha_s=0.0, bandwidth_Bps=1e9, overlaps=False)
    comm = 60 * MIB / 1e9  # the three buckets, in turn
    # 90 ms a step, 30 of it forward: full recomputation reruns it in backward.
    assert predict.recomputed_step_s(0.09, "full") == pytest.approx((0.12, 0.09))
    assert predict.predict_step_s("ddp", 0.09, 60 * MIB, 2, busy, recompute="full") == pytest.approx(0.12 + comm)
    # Overlapped, the longer backward (60 + 30 ms) hides more of the 62.9 ms than 60 ms did.
    assert predict.predict_step_s("ddp", 0.09, 60 * MIB, 2, BANDWIDTH_ONLY, recompute="full") == pytest.approx(
        0.12 + 10 * MIB / 1e9)
    # Selective reruns what no flop count gives: its share must be measured.
    with pytest.raises(ValueError, match="rerun_share"):
        predict.predict_step_s("ddp", 0.09, 60 * MIB, 2, busy, recompute="selective")
    assert predict.predict_step_s("ddp", 0.09, 60 * MIB, 2, busy, rerun_share=0.25) == pytest.approx(
        0.09 + 0.25 * 0.03 + comm)
    # 4 micro batches: 4 steps of compute, the buckets once.
    assert predict.predict_step_s("ddp", 0.09, 60 * MIB, 2, busy, grad_accum=4) == pytest.approx(4 * 0.09 + comm)
    assert predict.predict_step_s("horovod", 0.09, 60 * MIB, 2, busy, grad_accum=4, cycle_s=0) == pytest.approx(
        4 * 0.09 + comm)
    with pytest.raises(ValueError, match="modelled for ddp, ddp_no_overlap, horovod, not zero3"):
        predict.predict_step_s("zero3", 0.09, 60 * MIB, 2, busy, grad_accum=4)


def test_cli_predicts_recomputation_and_accumulation(tmp_path):
    # 40 MB of gradients over 2 Polaris nodes: all but the last bucket hide under a 20 ms backward.
    base = ["--system", "polaris", "--step-ms", 30, "--params", 1e7, "--ranks", 8, "--strategy", "ddp"]
    steps = {}
    for name, extra in (("plain", []), ("full", ["--recompute", "full"]), ("accum", ["--grad-accum", "4"])):
        done = scaledl_predict(*base, *extra, "--json", tmp_path / f"{name}.json")
        assert done.returncode == 0, done.stderr
        steps[name] = json.loads((tmp_path / f"{name}.json").read_text())["rows"][0]
    comm = steps["plain"]["comm_ms"]
    assert steps["full"]["step_ms"] == pytest.approx(steps["plain"]["step_ms"] + 10)  # a 10 ms forward again
    assert steps["accum"]["step_ms"] == pytest.approx(4 * 30 + comm)  # 4 micro batches, the all-reduce once
    assert steps["accum"]["efficiency"] > steps["plain"]["efficiency"]  # the same comm over 4x the compute


def test_a_link_that_cannot_overlap_pays_every_bucket():
    # Gloo on a CPU whose cores all compute: the three buckets add up, whatever backward's length.
    busy = predict.Link(alpha_s=0.0, bandwidth_Bps=1e9, overlaps=False)
    total = 60 * MIB / 1e9
    for backward_s in (0.0, 0.05, 1.0):
        assert predict.exposed_comm_s("ddp", 60 * MIB, 2, busy, backward_s) == pytest.approx(total)
    assert predict.exposed_comm_s("horovod", 60 * MIB, 2, busy, 1.0, fusion_bytes=30 * MIB) == pytest.approx(
        total + 2 * 0.5e-3)
    assert predict.link_from_fit({"alpha_s": 0.0, "beta_s_per_byte": 1e-9}, 2, overlaps=False).overlaps is False
    # Only the first bucket is reached from compute: the other two queue behind it at the loop's cost,
    # here no latency against 1 ms a ring step inside a step (2 ring steps on 2 ranks).
    in_step = predict.Link(alpha_s=1e-3, bandwidth_Bps=1e9, overlaps=False)
    assert predict.exposed_comm_s("ddp", 60 * MIB, 2, in_step, 0.0, bucket_link=busy) == pytest.approx(total + 2e-3)
    assert predict.exposed_comm_s("ddp", 60 * MIB, 2, in_step, 0.0) == pytest.approx(total + 3 * 2e-3)


def test_horovod_fusion_and_cycle():
    # 60 MiB under the 128 MiB default threshold: one fused all-reduce, plus half a 1 ms cycle.
    assert predict.exposed_comm_s("horovod", 60 * MIB, 2, BANDWIDTH_ONLY, 0.05) == pytest.approx(
        60 * MIB / 1e9 + 0.5e-3)
    # A 30 MiB threshold: two messages of 31.9 ms each; 63.9 - 50 ms is left over, less than the last one.
    assert predict.exposed_comm_s("horovod", 60 * MIB, 2, BANDWIDTH_ONLY, 0.05, fusion_bytes=30 * MIB) == \
        pytest.approx(30 * MIB / 1e9 + 0.5e-3)


def test_pipeline_bubble():
    assert predict.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert predict.pipeline_step_s(1.0, 4, 8) == pytest.approx(0.25 * 11 / 8)
    assert predict.bubble_fraction(1, 8) == 0.0


def test_two_levels_the_slower_link_dominates():
    assert predict.link_for(4, predict.POLARIS) == predict.POLARIS.intra
    beyond = predict.link_for(8, predict.POLARIS)
    assert beyond.bandwidth_Bps == 50e9 and beyond.alpha_s == 10e-6
    rows = predict.table(0.1, 10**8, predict.POLARIS, ranks=(4, 8), strategies=("ddp_no_overlap",),
                         bucket_bytes=4e8)  # one bucket: one all-reduce of all 4e8 gradient bytes
    assert [row["nodes"] for row in rows] == [1, 2]
    assert rows[0]["comm_ms"] == pytest.approx(predict.allreduce_s(4e8, 4, predict.POLARIS.intra) * 1e3)
    assert rows[1]["comm_ms"] == pytest.approx(predict.allreduce_s(4e8, 8, beyond) * 1e3)


def test_link_from_fit_reads_the_ring_back():
    # A fit on 4 ranks of t = 6 alpha + 1.5 n / B gives back alpha and B.
    fit = {"alpha_s": 6 * LINK.alpha_s, "beta_s_per_byte": 1.5 / LINK.bandwidth_Bps}
    found = predict.link_from_fit(fit, 4)
    assert found.alpha_s == pytest.approx(LINK.alpha_s) and found.bandwidth_Bps == pytest.approx(LINK.bandwidth_Bps)


def test_sharded_strategies_read_their_own_collectives():
    # A reduce-scatter 3 times slower than half the all-reduce's ring, all-gathers as the ring says:
    # a fit on 2 ranks t = a + b n reads back to alpha = a, bandwidth = 1/2 / b.
    slow = predict.half_link_from_fit({"alpha_s": 0.0, "beta_s_per_byte": 1.5e-9}, 2)
    assert slow.bandwidth_Bps == pytest.approx(1e9 / 3) and slow.alpha_s == 0.0
    ring = predict.half_link_from_fit({"alpha_s": 4e-5, "beta_s_per_byte": 0.75e-9}, 4)
    assert ring.alpha_s == pytest.approx(4e-5 / 3) and ring.bandwidth_Bps == pytest.approx(1e9)
    # ZeRO-3 on 2 ranks, 1 MB, one unit: reduce-scatter 3 * 0.5 ms, two gathers of 0.5 ms each.
    assert predict.exposed_comm_s("zero3", 1e6, 2, BANDWIDTH_ONLY, 0.0, scatter_link=slow) == pytest.approx(2.5e-3)
    assert predict.exposed_comm_s("zero3", 1e6, 2, BANDWIDTH_ONLY, 0.0) == pytest.approx(1.5e-3)


def test_table_and_figure_for_the_lessons():
    rows, fig = predict.predict(0.05, 10**9, "polaris", measured=[{"strategy": "zero3", "nodes": 2, "efficiency": 0.5}],
                                ranks=(1, 4, 8), strategies=("ddp", "zero3"))
    assert len(rows) == 6 and all(row["efficiency"] == 1.0 for row in rows if row["ranks"] == 1)
    assert all(0 < row["efficiency"] < 1 for row in rows if row["ranks"] > 1)
    assert len(fig.axes[0].lines) >= 3


def test_figure_draws_full_nodes_and_keeps_coinciding_lines_visible():
    rows, fig = predict.predict(0.05, 10**9, "polaris", ranks=(1, 4, 8, 16), strategies=("ddp", "ddp_no_overlap"))
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    # 1 rank and 4 ranks are both one node: only the full node is drawn, once per node count.
    assert list(lines["ddp"].get_xdata()) == [1, 2, 4]
    four = next(r for r in rows if r["strategy"] == "ddp" and r["ranks"] == 4)
    assert lines["ddp"].get_ydata()[0] == four["efficiency"]
    assert lines["ddp_no_overlap"].get_linestyle() != lines["ddp"].get_linestyle()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "4"]


def scaledl_predict(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "scaledl.cli", "predict", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def write_comm(path, alpha_s=3e-4, beta=1e-9, ranks=2):
    path.write_text(json.dumps({"suite": "comm", "ranks": ranks,
                                "fits": {"allreduce": {"alpha_s": alpha_s, "beta_s_per_byte": beta}}}))
    return path


def test_cli_from_a_comm_fit(tmp_path):
    comm = write_comm(tmp_path / "comm.json")
    done = scaledl_predict("--comm-json", comm, "--step-ms", 40, "--params", 1.5e6, "--ranks", 1, 2,
                           "--strategy", "ddp", "zero3", "--json", tmp_path / "out" / "rows.json",
                           "--plot", tmp_path / "out" / "eff.png")
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "out" / "rows.json").read_text())["rows"]
    link = predict.link_from_fit({"alpha_s": 3e-4, "beta_s_per_byte": 1e-9}, 2)
    assert rows == predict.table(0.04, 1_500_000, link=link, ranks=[1, 2], strategies=("ddp", "zero3"))
    assert (tmp_path / "out" / "eff.png").stat().st_size > 0 and "zero3" in done.stdout


def test_cli_tensor_parallel_counts_its_activations_from_the_model(tmp_path):
    done = scaledl_predict("--system", "polaris", "--step-ms", 40, "--model", "transformer:256,2,4,32", "--ranks",
                           1, 2, 4, "--strategy", "tensor_parallel", "--micro-batch-size", 8,
                           "--json", tmp_path / "rows.json")
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    knobs = {**predict.tensor_parallel_collectives(2, 8, 32, 256),
             "split_share": predict.transformer_split_share(256, 2, 32)}
    from scaledl import models
    expected = predict.table(0.04, models.transformer_num_params(256, 2, 32), predict.POLARIS, ranks=[1, 2, 4],
                             strategies=("tensor_parallel",), **knobs)
    assert rows == expected and rows[1]["step_ms"] < 40  # the split compute outweighs 12 small all-reduces


def test_cli_prices_the_language_models_sizes_by_formula(tmp_path):
    """gpt:PRESET: the language model's preset counted by formula (a 2.7B model is never built), its tensor
    parallelism's activations from the preset's sizes."""
    from scaledl import models

    done = scaledl_predict("--system", "polaris", "--step-ms", 400, "--model", "gpt:gpt3-2.7b", "--nodes", 1, 2,
                           "--strategy", "zero3", "tensor_parallel", "--json", tmp_path / "rows.json")
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    size = models.GPT_PRESETS["gpt3-2.7b"]
    num_params = models.gpt_num_params(size["width"], size["depth"], size["seq_len"])
    assert f"{num_params:,} parameters" in done.stdout
    # The split layers' flops a token against theirs plus the head's, over the 256-byte vocabulary.
    split = size["depth"] * (6 * 12 * size["width"] ** 2 + 12 * size["seq_len"] * size["width"])
    knobs = {**predict.tensor_parallel_collectives(size["depth"], 8, size["seq_len"], size["width"]),
             "split_share": split / (split + 6 * size["width"] * models.VOCAB_SIZE)}
    assert rows == predict.table(0.4, num_params, predict.POLARIS, ranks=[4, 8],
                                 strategies=("zero3", "tensor_parallel"), **knobs)


BAD = [
    (["--system", "polaris", "--step-ms", 5, "--model", "gpt:gpt5"], "gpt:PRESET, PRESET one of tiny"),
    (["--system", "polaris", "--step-ms", 0, "--params", 1e9], "--step-ms"),
    (["--system", "polaris", "--step-ms", "nan", "--params", 1e9], "--step-ms"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e9, "--ranks", 0], "--ranks"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e9, "--backward-fraction", 1], "--backward-fraction"),
    (["--system", "polaris", "--comm-json", "x.json", "--step-ms", 5, "--params", 1e9], "--comm-json"),
    (["--alpha-us", 5, "--step-ms", 5, "--params", 1e9], "--bandwidth-gbps"),
    (["--alpha-us", 5, "--bandwidth-gbps", 1, "--step-ms", 5, "--params", 1e9, "--nodes", 2], "--nodes"),
    (["--comm-json", "missing.json", "--step-ms", 5, "--params", 1e9], "missing.json"),
    (["--comm-json", "notjson.json", "--step-ms", 5, "--params", 1e9], "not JSON"),
    (["--comm-json", "nofit.json", "--step-ms", 5, "--params", 1e9], "no all-reduce fit"),
    (["--system", "aurora", "--step-json", "nofit.json", "--params", 1e9], "--step-json"),
    (["--system", "aurora", "--step-ms", 5, "--model", "transformer:1,2"], "--model"),
    (["--system", "aurora", "--step-ms", 5, "--params", 1e9, "--plot", "out/eff.txt"], "--plot"),
    (["--system", "aurora", "--step-ms", 5, "--params", 1e9, "--strategy", "magic"], "--strategy"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e9, "--strategy", "tensor_parallel"], "--model"),
    (["--system", "polaris", "--step-ms", 5, "--model", "transformer:64,2,4,8", "--strategy", "tensor_parallel"],
     "heads"),  # the default ranks reach 256, over 4 heads
    (["--system", "polaris", "--step-ms", 5, "--model", "transformer", "--strategy", "tensor_parallel",
      "--micro-batch-size", 0], "--micro-batch-size"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e6, "--recompute", "selective"], "--rerun-share (measured)"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e6, "--rerun-share", 0.2], "leave out --rerun-share"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e6, "--grad-accum", 4], "leave out --strategy zero3"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e6, "--grad-accum", 0], "--grad-accum"),
    (["--system", "polaris", "--step-ms", 5, "--params", 1e6, "--strategy", "pipeline", "--recompute", "full"],
     "leave out --strategy pipeline"),
]


@pytest.mark.parametrize("args, named", BAD, ids=[named for _, named in BAD])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, named):
    (tmp_path / "notjson.json").write_text("{ not json")
    (tmp_path / "nofit.json").write_text(json.dumps({"suite": "comm", "ranks": 2, "fits": {}}))
    before = sorted(p.name for p in tmp_path.iterdir())
    done = scaledl_predict(*args, "--json", "out/rows.json", cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().count("\n") == 0 and named in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_quick_bench_predict_runs_for_real(tmp_path):
    output = run([tool("scaledl"), "bench", "predict", "--quick", "--out-dir", str(tmp_path)], timeout=600,
                 cwd=ROOT).stdout
    data = json.loads((tmp_path / "predict.json").read_text())
    assert "error" not in data, data.get("traceback")
    assert {row["variant"] for row in data["rows"]} >= {"ddp", "zero2", "zero3"}
    for row in data["rows"]:
        for key in ("single_ms", "predicted_ms", "measured_ms", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert row["ratio"] == pytest.approx(row["predicted_ms"] / row["measured_ms"], rel=2e-3)
        assert row["predicted_ms"] >= row["single_ms"] and row["ranks"] == 2
        low, high = map(float, row["ratio_range"].split("-"))
        assert low - 0.005 <= row["ratio"] <= high + 0.005  # the row is one of the repeated pairs
    assert data["link"]["alpha_s"] >= 0 and data["link"]["bandwidth_Bps"] > 0
    last = [line for line in output.splitlines() if line.startswith(("headline:", "wrote"))]
    assert last[0] == f"headline: {data['headline']['text']}" and "median" in last[0] and "worst" in last[0]
    assert (tmp_path / "predict.png").stat().st_size > 0
    # The suite's JSON feeds `scaledl predict`: its fit and first step give back its first prediction.
    first = data["rows"][0]
    done = scaledl_predict("--comm-json", tmp_path / "predict.json", "--step-json", tmp_path / "predict.json",
                           "--model", first["model"], "--ranks", 2, "--strategy", first["variant"],
                           "--json", tmp_path / "again.json")
    assert done.returncode == 0, done.stderr
    again = json.loads((tmp_path / "again.json").read_text())["rows"]
    assert again[-1]["step_ms"] == pytest.approx(first["predicted_ms"], rel=5e-3)
