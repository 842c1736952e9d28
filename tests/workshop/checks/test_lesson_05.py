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


def test_resumed_start_check(capsys):
    """Exercise 2's order: wrap, load the checkpoint into the wrapped optimizer, then broadcast."""
    own = ["r0", "r1"]  # each rank's own checkpoint
    right = [{"optimizer": "r0", "resumed": r} for r in own]
    assert checks.check_resumed_start(right)
    assert "wrapped, loaded, then broadcast" in verdict(capsys)
    # Broadcast, then load: each rank's own momentum comes back (a missing broadcast looks the same).
    fails(capsys, checks.check_resumed_start([{"optimizer": r, "resumed": r} for r in own]),
          "rank 1 starts from its own checkpoint's optimizer state", "after loading the checkpoint")
    # Loaded before the wrap (or never): every rank agrees, on an empty or fresh state.
    fails(capsys, checks.check_resumed_start([{"optimizer": "fresh", "resumed": r} for r in own]),
          "rank 0 starts from an optimizer state that is not rank 0's checkpoint", "wrap first")
    fails(capsys, checks.check_resumed_start([right[0], None]), "did not finish")
    fails(capsys, checks.check_resumed_start(None), "did not finish")
    fails(capsys, checks.check_resumed_start(right[:1]), "start 2 or more")


class LiveRanks:
    """Live ranks as an ipyparallel view shows them: `execute` runs code in every rank's namespace, `pull`
    reads a name from each."""

    def __init__(self, *namespaces):
        self.namespaces = namespaces

    def execute(self, code, block=True):
        for namespace in self.namespaces:
            exec(code, namespace)

    def pull(self, name, block=True):
        return [namespace[name] for namespace in self.namespaces]


def test_the_gradients_names_are_read_off_each_ranks_wrapped_optimizer(capsys):
    """The check reads Horovod's private name table so that the lesson's cells need not; a rank without a
    wrapped optimizer gives None, and unnamed parameters still reach check_horovod_sync's hint."""

    class Wrapped:  # what hvd.DistributedOptimizer keeps: each parameter's name
        def __init__(self, *names):
            self._parameter_names = {object(): name for name in names}

    named = LiveRanks({"optimizer": Wrapped("0.weight", "0.bias")}, {"optimizer": object()})
    assert checks.horovod_gradient_names(named) == [["0.bias", "0.weight"], None]
    unnamed = LiveRanks(*({"optimizer": Wrapped("allreduce.noname.0.0")} for _ in range(WORLD)))
    errors = [{"average": 3e-8, "sum": 4e-3}] * WORLD
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"]] * WORLD, "torch", errors,
                                            checks.horovod_gradient_names(unnamed)), "allreduce.noname.0.0")
