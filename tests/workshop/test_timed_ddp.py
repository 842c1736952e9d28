"""scaledl.workshop.timed_ddp (lesson 7's gap budget): the DDP rung under torchrun on 2 ranks, with every
all-reduce timed by a communication hook, trains as it does without the hook and leaves one lap a step."""

import json

import pytest

from conftest import run
from scaledl.hpc import launchers
from scaledl.workshop import timed_ddp

STEPS = 4


@pytest.mark.slow
def test_every_rank_times_each_all_reduce_of_the_unchanged_rung(tmp_path):
    args = ["--epochs", "1", "--max-steps", str(STEPS), "--batch-size", "16", "--out-dir", str(tmp_path)]
    run(launchers.torchrun(2, "scaledl.workshop.timed_ddp", args), env={"OMP_NUM_THREADS": "1"})
    summary = json.loads((tmp_path / "summary.json").read_text())  # the rung ran to its end, as without the hook
    assert summary["world_size"] == 2 and summary["samples_per_s"] > 0
    laps = timed_ddp.read_laps(tmp_path, 2)
    assert [len(rank) for rank in laps] == [STEPS, STEPS]  # this CNN's gradients are one bucket: one call a step
    for rank in laps:
        assert all(start < end for start, end in rank)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(rank, rank[1:]))


def test_without_an_out_dir_it_says_where_the_laps_go():
    with pytest.raises(SystemExit, match="--out-dir"):
        timed_ddp.main(["--epochs", "1"])
