"""Lesson 5's checks (a summed gradient in SGD's step): each passes the solution, FAILs on what an untouched
exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""

import numpy as np

from conftest import fails, verdict
from scaledl.workshop import checks

W, LR, WORLD = [1.0, -2.0], 0.1, 2
OWN = [[0.4, -1.2], [1.0, 0.2]]  # each rank's gradient on its own micro batch
MEAN = [(a + b) / 2 for a, b in zip(*OWN)]  # one process's gradient on both micro batches


def reference(rank):
    return {"w": W, "lr": LR, "own": OWN[rank], "global_gradient": MEAN,
            "one_process": [w - LR * g for w, g in zip(W, MEAN)]}


REFERENCES = [reference(0), reference(1)]


def results(summed, stepped):
    return [{"summed": summed, "stepped": stepped}] * WORLD


def sgd(scale, gradient=MEAN):
    return [w - LR * scale * g for w, g in zip(W, gradient)]


SUM = [WORLD * g for g in MEAN]


def test_summed_step_check(capsys):
    assert checks.check_summed_step(results(SUM, sgd(1)), REFERENCES, WORLD)
    assert "lr / 2" in verdict(capsys)
    # Unusual but right: the sum as NumPy numbers.
    assert checks.check_summed_step(results(list(np.float32(SUM)), sgd(1)), REFERENCES, WORLD)
    verdict(capsys)
    # The default op: Horovod averaged, and the step taken with it.
    fails(capsys, checks.check_summed_step(results(MEAN, sgd(1)), REFERENCES, WORLD), "averages unless told otherwise")
    # No all-reduce: each rank's own gradient.
    fails(capsys, checks.check_summed_step([{"summed": OWN[r], "stepped": sgd(1, OWN[r])} for r in range(WORLD)],
                                           REFERENCES, WORLD), "own gradient", "all-reduce it")
    # The sum taken at the same lr: world_size times the step.
    fails(capsys, checks.check_summed_step(results(SUM, sgd(WORLD)), REFERENCES, WORLD), "2x too large",
          "divide lr")
    # Divided twice.
    fails(capsys, checks.check_summed_step(results(SUM, sgd(1 / WORLD)), REFERENCES, WORLD), "2x too small")
    # Added instead of subtracted.
    fails(capsys, checks.check_summed_step(results(SUM, sgd(-1)), REFERENCES, WORLD), "uphill")
    # The sum right, the step from this rank's own gradient.
    fails(capsys, checks.check_summed_step([{"summed": SUM, "stepped": sgd(1, OWN[r])} for r in range(WORLD)],
                                           REFERENCES, WORLD), "own gradient: use summed")
    # Untouched exercise: from_ranks already said FAIL and gave None; one rank; the reference cell not run.
    assert not checks.check_summed_step(None, REFERENCES, WORLD)
    fails(capsys, checks.check_summed_step(results(SUM, sgd(1))[:1], REFERENCES[:1], 1), "start 2 or more")
    fails(capsys, checks.check_summed_step(results(SUM, sgd(1)), [None, None], WORLD), "reference cell")
