"""Each rank's cores against its GPU's NUMA node, on recorded Polaris and Aurora sysfs trees.

The trees (tests/data/sysfs/, see its README) hold ALCF's published topology: on Polaris the
A100s sit on the NUMA nodes in reverse order (GPU 0 next to cores 24-31); on Aurora GPUs 0-2 sit
on socket 0 and 3-5 on socket 1, and cores 0 and 52 are reserved.  The launch commands are the
ones `scaledl launch` builds, the wrappers in them really run (bash), and the check reads the trees.
"""
import os
import subprocess

import pytest

from conftest import DATA
from scaledl.hpc import binding
from scaledl.hpc.launch import Target, build_plan
from scaledl.hpc.systems import AURORA_CPU_LISTS, POLARIS_GPU_BIND, RESERVED_CPUS

TREES = DATA / "sysfs"
POLARIS, AURORA = TREES / "polaris", TREES / "aurora"
TRAIN = Target("train.py")
# What `scaledl launch --system polaris` ran before: depth binding, every GPU visible, cuda:<local_rank>.
OLD_POLARIS = ["mpiexec", "-n", "4", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth", "--hostfile", "nodes",
               "--env", "OMP_NUM_THREADS=8", "python", "train.py"]
# What `scaledl launch --system aurora` ran before: ALCF's CPU lists and a GPU.tile mask per rank.
OLD_AURORA_BIND = ('r=${PALS_LOCAL_RANKID:?not started by PALS mpiexec}; '
                   'export ZE_AFFINITY_MASK=$((r / 2 % 6)).$((r % 2)); exec "$@"')
OLD_AURORA = ["mpiexec", "-n", "12", "--ppn", "12", "--cpu-bind", "list:" + ":".join(AURORA_CPU_LISTS),
              "--hostfile", "nodes", "bash", "-c", OLD_AURORA_BIND, "tile-bind", "python", "train.py"]


def launched(system, ranks, env=None):
    plan = build_plan(ranks, TRAIN, ppn=ranks, system=system, env=dict(env or {}), python="python", dry_run=True)
    return plan.command, {**(env or {}), **plan.env}


def verdicts(placements):
    return [p.verdict for p in placements]


def test_cpulists_read_and_write_as_sysfs_does():
    assert binding.parse_cpulist("0-7,32-39\n") == frozenset([*range(8), *range(32, 40)])
    assert binding.parse_cpulist("") == frozenset()  # Aurora's HBM nodes have memory and no CPUs
    assert binding.format_cpulist({49, 50, 51, 53, 54, 55, 56, 57}) == "49-51,53-57"
    assert binding.format_cpulist({3}) == "3"


def test_the_trees_hold_the_published_topology():
    assert binding.gpus(POLARIS) == ["0000:07:00.0", "0000:46:00.0", "0000:85:00.0", "0000:c7:00.0"]
    assert [binding.gpu_numa_node(a, POLARIS) for a in binding.gpus(POLARIS)] == [3, 2, 1, 0]
    assert binding.numa_nodes(POLARIS)[3] == binding.parse_cpulist("24-31,56-63")
    assert [binding.gpu_numa_node(a, AURORA) for a in binding.gpus(AURORA, "xpu")] == [0, 0, 0, 1, 1, 1]
    assert binding.gpus(AURORA, "cuda") == [] and binding.numa_nodes(AURORA)[2] == frozenset()


def test_the_pals_model_reproduces_alcfs_published_bindings():
    # Polaris, hello_affinity with 8 ranks of --depth=8 --cpu-bind depth: (0-7), (8-15), ... (56-63).
    polaris = sorted(binding.online_cpus(POLARIS))
    assert [binding.format_cpulist(binding.pals_cpus("depth", 8, r, polaris)) for r in range(8)] == \
        [f"{8 * r}-{8 * r + 7}" for r in range(8)]
    # Aurora, 12 ranks of --depth=8 --cpu-bind=depth over the cores left after 0 and 52: rank 6 straddles.
    aurora = sorted(binding.online_cpus(AURORA) - set(RESERVED_CPUS["aurora"]))
    cpus = [binding.format_cpulist(binding.pals_cpus("depth", 8, r, aurora)) for r in range(12)]
    assert cpus[0] == "1-8" and cpus[6] == "49-51,53-57" and cpus[11] == "90-97"
    assert binding.pals_cpus("list:1-8:9-16", 1, 1, aurora) == frozenset(range(9, 17))


def test_polaris_before_every_rank_fed_its_gpu_from_another_numa_node():
    placements = binding.plan(OLD_POLARIS, {}, "cuda", 4, POLARIS)
    assert verdicts(placements) == ["far"] * 4
    assert placements[0].cpu_nodes == (0,) and placements[0].gpu_node == 3  # cores 0-7, GPU 0 by cores 24-31


@pytest.mark.parametrize("ranks", [4, 2, 1])
def test_polaris_now_every_rank_is_next_to_its_gpu(ranks):
    command, env = launched("polaris", ranks)
    placements = binding.plan(command, env, "cuda", ranks, POLARIS)
    assert verdicts(placements) == ["local"] * ranks
    assert [p.gpu_node for p in placements] == list(range(ranks))  # local rank r: NUMA node r, GPU 3 - r
    assert len({p.gpu for p in placements}) == ranks


def test_polaris_wrapper_needs_pals():
    outside = subprocess.run(["bash", "-c", POLARIS_GPU_BIND, "gpu-bind", "true"], env={"PATH": os.defpath},
                             capture_output=True, text=True)
    assert outside.returncode != 0 and "not started by PALS mpiexec" in outside.stderr


def test_aurora_before_the_tile_masks_select_nothing_under_the_frameworks_module():
    _, env = launched("aurora", 12)
    placements = binding.plan(OLD_AURORA, env, "xpu", 12, AURORA, RESERVED_CPUS["aurora"])
    assert verdicts(placements) == ["no GPU"] * 12
    assert "not valid with ZE_FLAT_DEVICE_HIERARCHY=FLAT" in placements[0].reason


def test_aurora_without_flat_devices_half_the_ranks_cross_sockets():
    # A ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE that the user set is kept: 6 devices, xpu:<r % 6>.
    command, env = launched("aurora", 12, {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"})
    placements = binding.plan(command, env, "xpu", 12, AURORA, RESERVED_CPUS["aurora"])
    assert verdicts(placements) == ["local"] * 3 + ["far"] * 6 + ["local"] * 3


def test_aurora_depth_binding_splits_rank_6_across_the_sockets():
    _, env = launched("aurora", 12)
    depth = ["mpiexec", "-n", "12", "--ppn", "12", "--depth", "8", "--cpu-bind", "depth", "python", "train.py"]
    placements = binding.plan(depth, env, "xpu", 12, AURORA, RESERVED_CPUS["aurora"])
    assert [r for r, v in enumerate(verdicts(placements)) if v != "local"] == [6]
    assert placements[6].verdict == "split" and placements[6].cpu_nodes == (0, 1)


@pytest.mark.parametrize("ranks", [12, 6, 2])
def test_aurora_now_every_rank_is_on_its_gpus_socket(ranks):
    command, env = launched("aurora", ranks)
    placements = binding.plan(command, env, "xpu", ranks, AURORA, RESERVED_CPUS["aurora"])
    assert verdicts(placements) == ["local"] * ranks
    assert [p.gpu for p in placements] == [binding.gpus(AURORA)[r // 2] for r in range(ranks)]


def test_this_rank_reads_its_own_affinity():
    import torch

    placement = binding.this_rank(torch.device("cpu"), local_rank=0)
    assert placement.cpus == frozenset(os.sched_getaffinity(0))
    assert placement.verdict == "no GPU" and "cpu" in placement.reason


def test_what_a_mask_leaves_visible():
    addresses = binding.gpus(POLARIS)
    assert binding.visible_gpu("cuda", 1, {"CUDA_VISIBLE_DEVICES": "2,0"}, POLARIS) == (addresses[0], "")
    assert binding.visible_gpu("cuda", 2, {"CUDA_VISIBLE_DEVICES": "2,0"}, POLARIS)[0] is None
    gpu, why = binding.visible_gpu("cuda", 0, {"CUDA_VISIBLE_DEVICES": "GPU-87969d3e"}, POLARIS)
    assert gpu is None and "cannot tell which GPU" in why
    # Aurora under FLAT: flat device 7 is tile 1 of GPU 3, the first GPU of socket 1.
    assert binding.visible_gpu("xpu", 0, {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT", "ZE_AFFINITY_MASK": "7"},
                               AURORA) == ("0001:18:00.0", "")


# Telling ranks' devices apart (lesson 0's ready check): under FLAT both tiles of an Aurora GPU are
# devices with the GPU's one PCI address, so 12 correct ranks show 6 addresses.

@pytest.mark.parametrize("masked", [False, True], ids=["xpu:local_rank", "one tile per rank"])
def test_twelve_aurora_ranks_on_six_addresses_are_twelve_devices(masked):
    flat = {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
    envs = [{**flat, "ZE_AFFINITY_MASK": str(r)} if masked else flat for r in range(12)]
    index = [0 if masked else r for r in range(12)]
    addresses = [binding.visible_gpu("xpu", index[r], envs[r], AURORA)[0] for r in range(12)]
    ids = [binding.identity("xpu", index[r], envs[r], AURORA) for r in range(12)]
    assert len(set(addresses)) == 6 and None not in addresses
    assert len(set(ids)) == 12
    assert binding.ranks_problems(["xpu:0"] * 12, ids, ["local"] * 12) == []
    # Two ranks on one tile (the same mask twice) are still caught.
    twice = [*ids[:11], ids[0]]
    assert "two ranks share a device" in binding.ranks_problems(["xpu:0"] * 12, twice, ["local"] * 12)[0]


def test_a_uuid_wins_over_the_address_and_cuda_masks_name_the_physical_gpu():
    assert binding.identity("cuda", 0, {}, POLARIS, uuid="GPU-1234") == "GPU-1234"
    ids = [binding.identity("cuda", 0, {"CUDA_VISIBLE_DEVICES": str(3 - r)}, POLARIS) for r in range(4)]
    assert len(set(ids)) == 4 and all(i.endswith(f"unit {3 - r}") for r, i in enumerate(ids))


def test_unknown_numa_passes_far_and_split_fail_and_cpu_ranks_share_nothing():
    assert binding.ranks_problems(["cuda:0", "cuda:0"], ["a", "b"], ["unknown", "local"]) == []
    assert binding.ranks_problems(["cpu", "cpu"], [None, None], ["no GPU", "no GPU"]) == []
    far = binding.ranks_problems(["cuda:0", "cuda:0"], ["a", "b"], ["local", "far"])
    assert len(far) == 1 and "next to its GPU" in far[0]
    split = binding.ranks_problems(["cuda:0"], ["a"], ["split"])
    assert len(split) == 1


def test_a_cpu_rank_has_no_device_identity():
    import torch

    assert binding.device_identity(torch.device("cpu")) is None
