"""Lesson 9's live count of FSDP2's collectives: the tally by op, and one run on a single gloo rank in
this process (where FSDP2 skips its collectives, so only the bookkeeping is checked; the lesson's
live ranks and its nbval run check the counts themselves)."""
import pytest
import torch
import torch.distributed as dist

from scaledl.workshop import fsdp_counts


def test_tally_sums_gathers_and_scatters_by_op_name():
    counts = {"c10d._allgather_base_": 4, "c10d.allgather_into_tensor_coalesced_": 1,
              "c10d._reduce_scatter_base_": 3, "c10d.allreduce_": 7}
    assert fsdp_counts.tally(counts) == {"all_gathers": 5, "reduce_scatters": 3}
    assert fsdp_counts.tally({}) == {"all_gathers": 0, "reduce_scatters": 0}


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_each_setting_builds_shards_and_runs_a_fresh_model(one_rank):
    built = []

    def make_model():
        torch.manual_seed(0)
        built.append(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4),
                                         torch.nn.Linear(4, 3)))
        return built[-1]

    counted = fsdp_counts.count_collectives(make_model, lambda model: [model[0], model[2]], torch.randn(2, 4),
                                            torch.tensor([0, 2]))
    assert list(counted) == ["None", "True", "False"] and len({id(model) for model in built}) == 3
    for row in counted.values():
        assert row["layers"] == 2 and row["root_holds_params"] is True
        assert set(row) == {"all_gathers", "reduce_scatters", "layers", "whole_after_forward", "root_holds_params"}
    assert all(param.grad is not None for param in built[0].parameters())  # forward and backward ran
