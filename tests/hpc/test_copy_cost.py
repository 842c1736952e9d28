"""What a far rank's copies cost: a row per NUMA node and batch size, timed for real here on the CPU
(the gpu tier times host-to-GPU copies)."""
import subprocess
import sys

import pytest

from scaledl.hpc import binding, copy_cost


def test_every_numa_node_copies_each_batch():
    import torch

    sizes = {"small": 4096, "large": 8 * 2**20}
    rows = copy_cost.measure(torch.device("cpu"), sizes=sizes, repeats=3)
    nodes = sorted(node for node, cpus in binding.numa_nodes().items() if cpus) or [0]
    assert [(r.node, r.name) for r in rows] == [(n, name) for n in nodes for name in sizes]
    assert all(r.seconds > 0 and r.nbytes == sizes[r.name] and not r.pinned for r in rows)
    small, large = rows[0], rows[1]
    assert large.seconds > small.seconds  # 2048 times the bytes takes longer, whatever the machine
    assert "large" in copy_cost.table(rows).splitlines()[2]


def test_the_thread_goes_back_where_it_was():
    import os

    import torch

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    copy_cost.measure(torch.device("cpu"), sizes={"small": 4096}, repeats=1, nodes={0: frozenset([min(before)])})
    assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda"], "device 'cuda' is not available"),
    (["--device", "gpu0"], "unknown device 'gpu0'"),
    (["--device", "cpu", "--repeats", "0"], "must be at least 1"),
    (["--device", "cpu", "--repeats", "many"], "invalid int value"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = subprocess.run([sys.executable, "-m", "scaledl.hpc.copy_cost", *args], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_command_prints_a_table():
    result = subprocess.run([sys.executable, "-m", "scaledl.hpc.copy_cost", "--device", "cpu", "--repeats", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["NUMA", "node"] and any("MNIST batch 64" in line for line in lines)
