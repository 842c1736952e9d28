"""Lesson 0's checks (a binding launch, its verdicts and the prediction): each passes the solution, FAILs on what
an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

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
    # A failure names the wrong rank and what to read, never the right value: retrying does not pass it.
    def no_answer(line, rank):
        right_gpu, right_node = right[rank]
        assert f"GPU {right_gpu}" not in line and f"NUMA node {right_node}" not in line, line

    # The guess most people make first: rank r on GPU r, on NUMA node r.
    line = fails(capsys, checks.check_binding_prediction({r: (r, r) for r in range(4)}, placements, gpu_nodes),
                 "local rank 0 does not drive GPU 0", "cuda:<local_rank>", "CUDA_VISIBLE_DEVICES")
    no_answer(line, 0)
    assert "NUMA node 3" not in line  # GPU 0's: the table gives it, the check does not
    # Another wrong GPU, on the right NUMA node.
    line = fails(capsys, checks.check_binding_prediction({0: (3, 0), 1: (0, 1), 2: (1, 2), 3: (0, 3)}, placements,
                                                         gpu_nodes), "local rank 1 does not drive GPU 0",
                 "CUDA_VISIBLE_DEVICES to for local rank 1")
    no_answer(line, 1)
    # The right GPUs, each given the NUMA node of its number.
    line = fails(capsys, checks.check_binding_prediction({r: (3 - r, 3 - r) for r in range(4)}, placements,
                                                         gpu_nodes), "local rank 0: GPU 3 is right, NUMA node 3 is not",
                 "row of the table")
    assert "NUMA node 0" not in line
    # Off by one: 4 - r.
    fails(capsys, checks.check_binding_prediction({r: (4 - r, r) for r in range(4)}, placements, gpu_nodes),
          "does not drive GPU 4", "GPUs 0-3")
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
    # The first guess (depth binding keeps each rank by its GPU), the two swapped, the same for both.
    fails(capsys, checks.check_binding_verdicts({0: "local", 1: "local"}, depth_16), "local rank 0 is not local",
          "NUMA nodes its 16 cores span")
    fails(capsys, checks.check_binding_verdicts({0: "far", 1: "split"}, depth_16), "local rank 0 is not far")
    fails(capsys, checks.check_binding_verdicts({0: "split", 1: "split"}, depth_16), "local rank 1 is not split")
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
