"""Lesson 0's checks (a binding launch and its verdicts): each passes the solution, says NOT ATTEMPTED YET
on what an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

import re

from conftest import DATA, fails, unattempted, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- lesson 0

def polaris_ranks(ranks: int, cpu_bind: str, depth: int = 16):
    """A launch of `ranks` ranks a node with ALCF's wrapper and the learner's --cpu-bind, on the recorded tree."""

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    command = ["mpiexec", "-n", str(ranks), "--ppn", str(ranks), "--depth", str(depth), "--cpu-bind", cpu_bind,
               "bash", "-c", 'export CUDA_VISIBLE_DEVICES=$((3 - PALS_LOCAL_RANKID % 4)); exec "$@"', "bind",
               "python", "train.py"]
    return binding.plan(command, {}, "cuda", ranks, root)


def test_binding_verdicts_check(capsys):
    # rank 0 on NUMA nodes 0-1 with GPU 3 (node 0), rank 1 on 2-3 with GPU 2 (node 1)
    depth_16 = polaris_ranks(2, "depth")
    assert checks.check_binding_verdicts({0: "split", 1: "far"}, depth_16)
    assert "local rank 1: far" in verdict(capsys)
    # Unusual but right: digit strings for the ranks, capitals and spaces in the words.
    assert checks.check_binding_verdicts({"0": " Split", "1": "FAR"}, depth_16)
    verdict(capsys)
    # The verdicts are graded together: every wrong pair (the first guess, depth binding keeps each rank by its GPU;
    # the two swapped; one of the two right) FAILs with how many are wrong, naming no rank and no rank's answer.
    wrong = {2: [{0: "local", 1: "local"}, {0: "far", 1: "split"}], 1: [{0: "split", 1: "split"}, {0: "far", 1: "far"},
             {0: "local", 1: "far"}, {0: "split", 1: "local"}]}
    for count, pairs in wrong.items():
        lines = {fails(capsys, checks.check_binding_verdicts(pair, depth_16), "not the verdicts of this launch",
                       f"{count} of the 2 {'is' if count == 1 else 'are'} wrong", "does not say which",
                       "NUMA nodes its cores span") for pair in pairs}
        assert len(lines) == 1, lines  # the same line for every set with as many wrong
        line = lines.pop()
        assert not re.search(r"rank \d|\b(split|far)\b", line), line
    fails(capsys, checks.check_binding_verdicts({0: "split"}, depth_16), "1 missing")
    fails(capsys, checks.check_binding_verdicts({0: "half", 1: "far"}, depth_16), "'half' is not a verdict")
    fails(capsys, checks.check_binding_verdicts(["split", "far"], depth_16), "is a dict")
    unattempted(capsys, checks.check_binding_verdicts({}, depth_16), "VERDICTS")
    # ALCF's own --depth 8 on 2 ranks: both local, and a verdict of "split" is then wrong.
    assert checks.check_binding_verdicts({0: "local", 1: "local"}, polaris_ranks(2, "depth", depth=8))
    verdict(capsys)


def test_binding_launch_check(capsys):
    assert checks.check_binding_launch(polaris_ranks(2, "list:0-7:8-15"))
    assert "rank 1: CPUs 8-15" in verdict(capsys)
    # Unusual but right: the cores' second hardware threads only, and a whole NUMA node with them.
    assert checks.check_binding_launch(polaris_ranks(2, "list:32-39:40-47"))
    verdict(capsys)
    assert checks.check_binding_launch(polaris_ranks(2, "list:0-7,32-39:8-15,40-47"))
    verdict(capsys)
    # The first guess, 16 cores deep: rank 0 split over NUMA nodes 0-1, rank 1 far on 2-3.
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "depth")), "local rank 0", "(split)", "NUMA node 0 only")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "list:8-15:0-7")), "(far)", "NUMA node 0 only")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "none")), "(split)")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "list:0:8")), "1 CPU", "at least 8 of its NUMA")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "list:0-3:8-11")), "4 CPUs")
    # 8 ranks, two to a GPU (the wrapper's r % 4): each local, but ranks r and r + 4 on the same cores.
    fails(capsys, checks.check_binding_launch(polaris_ranks(8, "list:0-7:8-15:16-23:24-31:0-7:8-15:16-23:24-31")),
          "share CPUs")
    unattempted(capsys, checks.check_binding_launch([]), "CPU_BIND")


def test_four_rank_verdicts_check(capsys):
    """Appendix Exercise 1: 4 ranks a node at ALCF's PyTorch `--depth 16`, the wrapper unchanged. Ranks 2 and 3
    take the second hardware threads (32-63), which sit on NUMA nodes 0-1 and 2-3."""
    placements = polaris_ranks(4, "depth")
    right = {0: "split", 1: "far", 2: "far", 3: "split"}
    assert checks.check_binding_verdicts(right, placements)
    assert "local rank 2: far; local rank 3: split" in verdict(capsys)
    assert checks.check_binding_verdicts({str(r): word.upper() for r, word in right.items()}, placements)
    verdict(capsys)
    # Graded whole: the first guess (all local), the 2-rank pattern repeated, the hardware threads read as local
    # (past the table's cores), one rank off: each says how many of the 4 are wrong, naming no rank and no verdict,
    # and sets with as many wrong get the same line.
    wrong = [({r: "local" for r in range(4)}, 4), ({0: "split", 1: "far", 2: "split", 3: "far"}, 2),
             ({0: "split", 1: "far", 2: "local", 3: "local"}, 2), ({r: "split" for r in range(4)}, 2),
             ({**right, 3: "far"}, 1), ({**right, 0: "local"}, 1)]
    lines = {}
    for guess, count in wrong:
        line = fails(capsys, checks.check_binding_verdicts(guess, placements), "not the verdicts of this launch",
                     f"{count} of the 4 {'is' if count == 1 else 'are'} wrong", "NUMA nodes its cores span")
        assert not re.search(r"rank \d|\d+-\d+|\b(local|split|far)\b", line), line
        lines.setdefault(count, set()).add(line)
    assert all(len(same) == 1 for same in lines.values()), lines
    fails(capsys, checks.check_binding_verdicts({r: "far" for r in range(3)}, placements), "3 missing")


def test_four_rank_binding_check(capsys):
    # Right: each rank on GPU 3 - r's NUMA node r, its 8 cores, with or without their second hardware threads.
    for cpu_bind in ("list:0-7:8-15:16-23:24-31", "list:0-7,32-39:8-15,40-47:16-23,48-55:24-31,56-63",
                     "list:32-39:40-47:48-55:56-63"):
        assert checks.check_binding_launch(polaris_ranks(4, cpu_bind)), cpu_bind
        line = verdict(capsys)
        assert "every rank on its GPU's NUMA node" in line
        assert re.search(r"rank 3: CPUs [\d,-]+, GPU on NUMA 3\)$", line), line
    # Wrong: the launch as given (16 deep), the table's rows in GPU order (every rank far), 4 cores a rank.
    fails(capsys, checks.check_binding_launch(polaris_ranks(4, "depth")), "local rank 0", "(split)", "NUMA node 0 only")
    fails(capsys, checks.check_binding_launch(polaris_ranks(4, "list:24-31:16-23:8-15:0-7")), "local rank 0",
          "(far)", "NUMA node 0 only")
    fails(capsys, checks.check_binding_launch(polaris_ranks(4, "list:0-3:8-11:16-19:24-27")), "4 CPUs",
          "at least 8 of its NUMA")
    fails(capsys, checks.check_binding_launch(polaris_ranks(4, "list:0-7:8-15:16-23:0-7")), "local rank 3", "(far)")
