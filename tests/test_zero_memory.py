"""ZeRO's formulas against the bytes a real DeepSpeed engine keeps on each of 2 ranks."""
import pytest

from conftest import reports, run
from scaledl import zero_memory
from scaledl.hpc import launchers


def test_formulas_partition_one_more_quantity_per_stage():
    sizes = [zero_memory.predict(1000, 4, stage) for stage in range(4)]
    assert sizes[0] == {"params": 4000, "grads": 4000, "optimizer": 4000, "total": 12000}
    assert sizes[1]["optimizer"] == 8 * 250 and sizes[1]["grads"] == 4000
    assert sizes[2]["grads"] == 4 * 250 and sizes[2]["params"] == 4000
    assert sizes[3] == {"params": 1000, "grads": 1000, "optimizer": 2000, "total": 4000}
    # The paper's example: 7.5B parameters, mixed-precision Adam, 64 ranks, stage 3: 1.9 GB.
    paper = zero_memory.predict(7_500_000_000, 64, 3, param_bytes=2, grad_bytes=2, optimizer_bytes=12)
    assert paper["total"] / 1e9 == pytest.approx(1.875, rel=1e-3)


def test_mixed_precision_saves_no_state_at_stage_0_and_a_quarter_at_stage_3():
    fp32 = [zero_memory.predict(1000, 4, stage)["total"] for stage in range(4)]
    bf16 = [zero_memory.predict(1000, 4, stage, precision="bf16")["total"] for stage in range(4)]
    assert fp32[0] == bf16[0] == 12 * 1000  # 4 + 4 + 4 against 2 + 2 + (4 master + 4 momentum)
    assert bf16[3] * 4 == fp32[3] * 3
    assert zero_memory.bytes_per_param("fp16", 2) == zero_memory.bytes_per_param("bf16", 2) == (2, 2, 8)
    assert zero_memory.bytes_per_param("fp32", 0, optimizer_state_bytes=8) == (4, 4, 8)  # Adam, no master copy
    # FSDP2's shards are fp32 under any precision: ZeRO-3's count with no separate master copy.
    assert zero_memory.predict_fsdp(1000, 4)["total"] == 3 * 4 * 250
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        zero_memory.bytes_per_param("fp8")


@pytest.mark.slow
def test_engine_holds_what_the_formula_says():
    """Each stage's engine in fp32 and in bf16 (an fp32 master copy beside 16-bit weights and gradients)."""
    stages = [0, 1, 2, 3]
    found = reports(run(launchers.deepspeed(2, "zero_probe", [str(s) for s in stages]), timeout=300).stdout)
    assert [r["rank"] for r in found] == [0, 1]
    assert sorted(found[0]["counted"]) == sorted(f"{s} {p}" for s in stages for p in ("fp32", "bf16"))
    for report in found:
        for key, counted in report["counted"].items():
            stage, precision = int(key.split()[0]), key.split()[1]
            expected = zero_memory.predict(report["num_params"], 2, stage, precision=precision)
            assert counted["predicted_total"] == expected["total"]  # what the rung's summary line says
            if stage == 1:
                # Counted after backward: stage 1 has reduced its full gradients (the paper's
                # G*Psi, held during backward) to this rank's partition by then.
                expected["grads"] = zero_memory.predict(report["num_params"], 2, 2, precision=precision)["grads"]
            for part in ("params", "grads", "optimizer"):
                # Partitions are padded to an aligned size: allow a few hundred bytes.
                assert counted[part] == pytest.approx(expected[part], abs=512), (key, part, counted, expected)
    for key in found[0]["counted"]:
        totals = [report["counted"][key]["total"] for report in found]
        assert totals[0] == pytest.approx(totals[1], abs=512), key


@pytest.mark.slow
def test_fsdp2_keeps_fp32_shards_and_gathers_bf16(tmp_path):
    """The FSDP2 rung's wrap under --precision bf16: each layer computes with bf16 weights, while the
    shards, their gradients and the momentum stay fp32 (the master copy): the same bytes as fp32."""
    found = reports(run(launchers.torchrun(2, "fsdp_memory_probe", []), timeout=300).stdout)
    assert [r["rank"] for r in found] == [0, 1]
    for report in found:
        expected = zero_memory.predict_fsdp(report["num_params"], 2)["total"]
        for precision, counted in report["found"].items():
            # FSDP2 pads each parameter's first dimension to a multiple of the ranks: a few rows more.
            assert counted["state_bytes"] == pytest.approx(expected, rel=0.01), (precision, counted)
            assert counted["shards"] == counted["grads"] == ["torch.float32"]
        assert report["found"]["fp32"]["gathered"] == ["torch.float32"]
        assert report["found"]["bf16"]["gathered"] == ["torch.bfloat16"]
