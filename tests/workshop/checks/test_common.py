"""What every check shares: each FAILs, in one line, on a name the exercise never set."""

import pytest

from conftest import verdict
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
def test_every_check_fails_on_a_name_never_set(check, args, capsys):
    assert check(*args) is False
    assert verdict(capsys).startswith("FAIL: ")
