"""Lesson 0's checks (a binding launch, its verdicts and the prediction): each passes the solution, FAILs on what
an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

import re

import numpy as np

from conftest import DATA, fails, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- lesson 0

def polaris_launch(wrapper: bool):
    """Where the 4 ranks of a `--depth 8 --cpu-bind depth` launch land on the recorded Polaris
    tree, with ALCF's `CUDA_VISIBLE_DEVICES = 3 - local_rank` wrapper or with every GPU visible."""

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    command = ["mpiexec", "-n", "4", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth", "python", "train.py"]
    if wrapper:
        command[-2:-2] = ["bash", "-c", 'export CUDA_VISIBLE_DEVICES=$((3 - PALS_LOCAL_RANKID)); exec "$@"', "bind"]
    gpu_nodes = binding.gpu_numa_nodes(root, "cuda")
    return binding.plan(command, {}, "cuda", 4, root), gpu_nodes


def test_binding_prediction_check(capsys):
    placements, gpu_nodes = polaris_launch(wrapper=True)
    right = {0: (3, 0), 1: (2, 1), 2: (1, 2), 3: (0, 3)}
    assert checks.check_binding_prediction(right, placements, gpu_nodes)
    assert "0->GPU 3" in verdict(capsys)
    # Unusual but right: GPUs by PCI address, lists instead of tuples, numpy integers.
    unusual = {int(r): [address.upper(), np.int64(node)] for r, (address, node) in
               enumerate(sorted(gpu_nodes.items(), key=lambda item: item[1]))}  # rank r: the GPU on NUMA node r
    assert checks.check_binding_prediction(unusual, placements, gpu_nodes)
    verdict(capsys)
    # The mapping is graded whole: every wrong mapping FAILs with the same line, however near, so retrying
    # values until the check passes learns nothing; no failure names the right GPU or NUMA node of any rank.
    def no_answer(line):
        for rank, (right_gpu, right_node) in right.items():
            assert f"{rank}->GPU" not in line and f"GPU {right_gpu}" not in line, line
            assert f"NUMA node {right_node}" not in line, line

    table = {gpu: node for gpu, node in enumerate(gpu_nodes.values())}  # GPU g: its NUMA node, as printed
    consistent = {gpus: {r: (g, table[g]) for r, g in enumerate(gpus)}
                  for gpus in [(3, 2, 0, 1), (3, 0, 1, 2), (1, 1, 1, 1), (2, 3, 0, 1)]}
    near = fails(capsys, checks.check_binding_prediction(consistent[(3, 2, 0, 1)], placements, gpu_nodes),
                 "not the GPUs this launch gives", "NUMA node of its cores")  # 2 of 4 right
    for gpus, prediction in consistent.items():
        line = fails(capsys, checks.check_binding_prediction(prediction, placements, gpu_nodes))
        assert line == near, (gpus, line)  # 1, 2 or no GPU right: the same words
        no_answer(line)
        assert "CUDA_VISIBLE_DEVICES" not in line, line
    # The guess most people make first, rank r on GPU r (NUMA node r, or the table's): the misreading it is gets a
    # line of its own, a named idea, not an entry.
    for guess in ({r: (r, r) for r in range(4)}, {r: (r, table[r]) for r in range(4)}):
        line = fails(capsys, checks.check_binding_prediction(guess, placements, gpu_nodes), "cuda:<local_rank>",
                     "NUMA node of its cores in the table")
        no_answer(line)
        # The learner answers from the table before the wrapper is printed: no failure gives its formula away.
        assert "CUDA_VISIBLE_DEVICES" not in line and "3 -" not in line, line
    # A NUMA node that is not the table's for the GPU named: the ranks are named (the table is printed anyway).
    line = fails(capsys, checks.check_binding_prediction({0: (2, 0), 1: (2, 1), 2: (1, 2), 3: (0, 3)}, placements,
                                                         gpu_nodes), "local rank 0: the NUMA node", "that GPU's row")
    no_answer(line)
    # The right GPUs, each given the NUMA node of its number: named as a misread table, not as right GPUs.
    line = fails(capsys, checks.check_binding_prediction({r: (3 - r, 3 - r) for r in range(4)}, placements,
                                                         gpu_nodes), "local ranks 0, 1, 2, 3: the NUMA node", "row")
    assert "right" not in line
    no_answer(line)
    # Off by one: 4 - r names a GPU the node does not have.
    fails(capsys, checks.check_binding_prediction({r: (4 - r, r) for r in range(4)}, placements, gpu_nodes),
          "names GPU 4", "GPUs 0-3")
    fails(capsys, checks.check_binding_prediction({r: "3" for r in range(4)}, placements, gpu_nodes),
          "write (GPU number, NUMA node)")
    # A launch with every GPU visible (cuda:<local_rank>) fails even with a prediction that matches it.
    identity, _ = polaris_launch(wrapper=False)
    assert [p.verdict for p in identity] == ["far"] * 4
    fails(capsys, checks.check_binding_prediction({r: (r, 3 - r) for r in range(4)}, identity, gpu_nodes),
          "local rank 0 on NUMA node 0 with a GPU on NUMA node 3 (far)")
    fails(capsys, checks.check_binding_prediction({0: (3, 0)}, placements, gpu_nodes), "every local rank 0-3")
    fails(capsys, checks.check_binding_prediction(None, placements, gpu_nodes), "`prediction` is not set")




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
    # the two swapped; one of the two right) FAILs with the same line, which names no rank and no rank's answer.
    wrong = [{0: "local", 1: "local"}, {0: "far", 1: "split"}, {0: "split", 1: "split"}, {0: "far", 1: "far"},
             {0: "local", 1: "far"}, {0: "split", 1: "local"}]
    lines = {fails(capsys, checks.check_binding_verdicts(pair, depth_16), "not the verdicts of this launch",
                   "NUMA nodes its cores span") for pair in wrong}
    assert len(lines) == 1, lines
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
