"""Lesson 0's checks (a binding launch and its verdicts): each passes the solution, FAILs on what
an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

import re

from conftest import DATA, fails, verdict
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
    fails(capsys, checks.check_binding_verdicts({}, depth_16), "`VERDICTS` is not set")
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
    fails(capsys, checks.check_binding_launch([]), "`CPU_BIND` is not set")


def polaris_eight(gpu_of_rank: str = "3 - r % 4"):
    """Appendix Exercise 1: 8 ranks a node, `--depth 4 --cpu-bind depth`, the launch's own wrapper with
    `gpu_of_rank` in place of `3 - r % 4` (bash evaluates it for each rank, as in the appendix)."""

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    script = ('r=${PALS_LOCAL_RANKID:?not started by PALS mpiexec}; export CUDA_VISIBLE_DEVICES=$((3 - r % 4)); '
              'exec "$@"')
    command = ["mpiexec", "-n", "8", "--ppn", "8", "--depth", "4", "--cpu-bind", "depth", "bash", "-c",
               script.replace("3 - r % 4", gpu_of_rank), "gpu-bind", "python", "train.py"]
    return binding.plan(command, {}, "cuda", 8, root)


def test_eight_rank_verdicts_check(capsys):
    placements = polaris_eight()
    right = {0: "local", **{r: "far" for r in range(1, 7)}, 7: "local"}
    assert checks.check_binding_verdicts(right, placements, name="EIGHT_RANK_VERDICTS")
    assert "local rank 7: local" in verdict(capsys)
    assert checks.check_binding_verdicts({str(r): word.upper() for r, word in right.items()}, placements)
    verdict(capsys)
    # Graded whole: the first guess (all local), the pattern of 4 ranks repeated, rank r's NUMA node read as r % 4,
    # split where two ranks share a node, one rank off: each says how many of the 8 are wrong, naming no rank and
    # no verdict, and sets with as many wrong get the same line.
    wrong = [({r: "local" for r in range(8)}, 6), ({r: "far" for r in range(8)}, 2),
             ({r: "local" if r in (0, 4) else "far" for r in range(8)}, 2),
             ({r: "local" if r < 4 else "far" for r in range(8)}, 4),
             ({r: "split" if r % 2 else "local" for r in range(8)}, 7),
             ({**right, 6: "local"}, 1), ({**right, 0: "far"}, 1), ({**right, 3: "split"}, 1)]
    lines = {}
    for guess, count in wrong:
        line = fails(capsys, checks.check_binding_verdicts(guess, placements), "not the verdicts of this launch",
                     f"{count} of the 8 {'is' if count == 1 else 'are'} wrong", "NUMA nodes its cores span")
        assert not re.search(r"rank \d|\d+-\d+|\b(local|split|far)\b", line), line
        lines.setdefault(count, set()).add(line)
    assert all(len(same) == 1 for same in lines.values()), lines
    fails(capsys, checks.check_binding_verdicts({r: "far" for r in range(7)}, placements, name="EIGHT_RANK_VERDICTS"),
          "7 missing")
    fails(capsys, checks.check_binding_verdicts(None, placements, name="EIGHT_RANK_VERDICTS"),
          "`EIGHT_RANK_VERDICTS` is not set")
    fails(capsys, checks.check_binding_verdicts(list(right.values()), placements, name="EIGHT_RANK_VERDICTS"),
          "`EIGHT_RANK_VERDICTS` is a dict")


def test_eight_rank_wrapper_check(capsys):
    def check(expression):
        return checks.check_binding_launch(polaris_eight(expression), min_cpus=4, name="GPU_OF_RANK", fix="gpu")

    # Right: each pair of ranks on a NUMA node drives the GPU there; bash evaluates the expression.
    for expression in ("3 - r / 2", "(7 - r) / 2", "3-r/2", "3 - (r >> 1)"):
        assert check(expression), expression
        assert "rank 7: CPUs 28-31, GPU on NUMA 3" in verdict(capsys)
    # Wrong, each with the reason it names: the 4-rank wrapper unchanged, the reversal forgotten, r % 4 halved.
    for expression in ("3 - r % 4", "r / 2", "3 - r % 4 / 2", "r % 4"):
        line = fails(capsys, check(expression), "(far)", "make the wrapper give it the GPU that the table puts on")
        assert "CPUs of NUMA node" not in line and "/ 2" not in line, line
    # 3 - r: from rank 4 on, negative numbers, and CUDA shows the rank no GPU at all.
    fails(capsys, check("3 - r"), "local rank 4 has no GPU", "CUDA_VISIBLE_DEVICES='-1' leaves no device 0",
          "one of the node's GPUs, 0-3")
    # Not bash: the wrapper fails, and the check says so rather than "not set".
    fails(capsys, check("3 - r // 2"), "has no GPU", "its wrapper failed", "syntax error")
    # The CPU-side message is unchanged for --cpu-bind exercises; min_cpus counts what each rank has.
    fails(capsys, checks.check_binding_launch(polaris_eight("3 - r / 2")), "4 CPUs", "at least 8 of its NUMA")
    fails(capsys, checks.check_binding_launch([], name="GPU_OF_RANK"), "`GPU_OF_RANK` is not set")
