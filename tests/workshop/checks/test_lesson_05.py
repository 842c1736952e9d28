"""Lesson 5's checks (Horovod's all-reduce in PyTorch): each passes the solution, FAILs on what an untouched
exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""

import numpy as np

from conftest import fails, verdict
from scaledl.workshop import checks


def test_horovod_allreduce_check(capsys):
    assert checks.check_horovod_allreduce([(3.0, 1.5), (3.0, 1.5)], 2)
    verdict(capsys)
    # Unusual but right: 4 ranks, the total as the average times the world size, NumPy numbers.
    assert checks.check_horovod_allreduce([(np.float32(2.5) * 4, np.float64(2.5))] * 4, 4)
    verdict(capsys)
    fails(capsys, checks.check_horovod_allreduce([(2.5, 2.5)] * 4, 4), "averages unless told otherwise")
    fails(capsys, checks.check_horovod_allreduce([(1.5, 1.5), (1.5, 1.5)], 2), "averages unless told otherwise")
    fails(capsys, checks.check_horovod_allreduce([(3.0, 3.0), (3.0, 3.0)], 2), "that is the sum")
    fails(capsys, checks.check_horovod_allreduce([(1.0, 1.0), (2.0, 2.0)], 2), "it still holds its own value")
    assert not checks.check_horovod_allreduce(None, 2)
