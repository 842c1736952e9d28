"""What every check shares: on a name the exercise never set, each says NOT ATTEMPTED YET in one line
(not FAIL: a page run before the exercise is filled shows no failure), returns False, and records
nothing in a class."""

import pytest

from conftest import unattempted
from scaledl import class_records
from scaledl.workshop import checks


@pytest.mark.parametrize("check, args", [
    (checks.check_training_memory, (None, 10)), (checks.check_training_nodes, (None, 1, 1, 1, 1, 1)),
    (checks.check_training_days, (None, 1, 1, 1, 1, 1)),
    (checks.check_samples_per_s, (None,)), (checks.check_sharding, (None,)), (checks.check_efficiency, (None, {1: 1})),
    (checks.check_warmup, (None,)), (checks.check_zero_formula, (None,)), (checks.check_parallelism_choice, (None,)),
    (checks.check_ring_prediction, (None,)), (checks.check_fusion, (None,)), (checks.check_batch_triple, (None,)),
    (checks.check_predicted_efficiency, (None,)), (checks.check_engine_bytes, (None,)),
    (checks.check_stopwatch_prediction, (None,)), (checks.check_ddp_buckets, (None,)),
    (checks.check_step_prediction, (None,)),
])
def test_every_check_says_not_attempted_on_a_name_never_set(check, args, capsys):
    unattempted(capsys, check(*args))


def test_a_name_never_set_is_not_recorded_as_a_failure(capsys, monkeypatch):
    recorded = []
    monkeypatch.setattr(class_records, "append_verdict", lambda *args, **kwargs: recorded.append(args[2]))
    unattempted(capsys, checks.check_parallelism_choice(None), "choose")
    assert recorded == []
    assert checks.check_training_memory({"weights": 0}, 10) is False  # a wrong answer: a FAIL, recorded
    assert capsys.readouterr().out.startswith("FAIL: ") and recorded == [False]


def test_a_name_missing_on_a_rank_is_not_attempted(capsys):
    class View:  # ipyparallel's view, whose pull raises when a rank never set the name
        def pull(self, name, block):
            raise NameError(name)

    assert checks.from_ranks(View(), "rank_device") is None
    unattempted(capsys, False, "rank_device", "on every rank")
