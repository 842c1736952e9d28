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


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_engine_holds_what_the_formula_says(stage):
    found = reports(run(launchers.deepspeed(2, "zero_probe", [str(stage)]), timeout=300).stdout)
    assert [r["rank"] for r in found] == [0, 1]
    for counted in found:
        expected = zero_memory.predict(counted["num_params"], 2, stage)
        if stage == 1:
            # Counted after backward: stage 1 has reduced its full gradients (the paper's
            # G*Psi, held during backward) to this rank's partition by then.
            expected["grads"] = zero_memory.predict(counted["num_params"], 2, 2)["grads"]
        for part in ("params", "grads", "optimizer"):
            # Partitions are padded to an aligned size: allow a few hundred bytes.
            assert counted[part] == pytest.approx(expected[part], abs=512), (part, counted, expected)
    assert found[0]["total"] == pytest.approx(found[1]["total"], abs=512)
