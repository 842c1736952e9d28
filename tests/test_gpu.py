"""The gpu tier: every lesson and every rung on the GPUs of this node, with NCCL.

    pytest -m gpu tests/test_gpu.py

Skipped on a machine without a CUDA GPU.  The lessons start one rank per GPU (their
`WORLD_SIZE = None`), so every `%%px` cell runs on `cuda:<local_rank>` with NCCL; a lesson or
rung that leaves a tensor on the CPU fails here, not on a learner's node.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from scaledl.hpc import launchers
from scaledl.workshop import engines

GPUS = engines.accelerator_count()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="no GPU on this machine")]

LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
# What a lesson needs beyond torch; a GPU node without it skips that lesson and says why.
NEEDS = {"04_horovod_tf": ("horovod", "tensorflow"), "05_horovod_torch": ("horovod",),
         "08_deepspeed": ("deepspeed",), "09_zero_fsdp": ("deepspeed",)}


def missing(names) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def text_of(notebook) -> str:
    return "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []))


@pytest.mark.parametrize("path", LESSONS, ids=[f"{path.parent.name}-{path.stem}" for path in LESSONS])
def test_lesson_runs_on_every_gpu(path):
    import nbformat
    from nbclient import NotebookClient

    absent = missing(NEEDS.get(path.stem, ()))
    if absent:
        pytest.skip(f"{', '.join(absent)} not installed on this GPU node")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in notebook.cells:
        if "nbval-check-output" in cell.metadata.get("tags", []):
            verdict = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert verdict.startswith("PASS: "), (path.name, cell.source, verdict)
    text = text_of(notebook)
    # One rank per GPU where the node has enough; else (a 1-GPU node) 2 ranks on the CPU, as engines.plan says.
    two = ("11_pipelines", "12_tensor_parallel", "13_sequences")
    world_size = 2 if path.stem in two else engines.default_world_size()
    on_gpus = world_size <= GPUS
    if "engines.start" in "".join(cell.source for cell in notebook.cells):
        assert f"{world_size} ranks up" in text
        assert on_gpus or "on the CPU with gloo" in text, path.name
    if "scaledl.setup" in "".join(cell.source for cell in notebook.cells):
        assert ("nccl" in text and "cuda:" in text) if on_gpus else ("gloo" in text and "cpu" in text), path.name


def rungs():
    try:
        from scaledl.ladder import RUNGS
    except ImportError:  # the table of rungs moved: run the modules the ladder has
        RUNGS = {}
    return sorted(RUNGS.items())


@pytest.mark.parametrize("name, rung", rungs(), ids=[name for name, _ in rungs()])
def test_rung_trains_on_every_gpu(name, rung, tmp_path):
    from conftest import run

    module, launcher, args = rung
    absent = missing({"horovodrun": ("horovod",), "deepspeed": ("deepspeed",)}.get(launcher, ()))
    if "tf" in module:
        absent += missing(("tensorflow",))
    if absent:
        pytest.skip(f"{', '.join(absent)} not installed on this GPU node")
    nproc = 1 if launcher == "python" else 2 if module == "pipeline" else GPUS
    if nproc > GPUS:
        pytest.skip("the pipeline's 2 stages need 2 GPUs (test_ranks_that_share_a_gpu_get_one_line: the refusal)")
    command = launchers.for_launcher(launcher, nproc, f"scaledl.ladder.{module}",
                                     [*args, "--epochs", "1", "--train-limit", "2048", "--out-dir", str(tmp_path)])
    run(command, timeout=900, nproc=nproc, env={"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))})
    summary = json.loads(Path(tmp_path, "summary.json").read_text())
    assert summary["world_size"] == nproc
    assert summary.get("params_in_sync", True) is True


@pytest.mark.parametrize("module", ["ddp", "pipeline"])
def test_ranks_that_share_a_gpu_get_one_line(module, tmp_path):
    """One rank more than the node has GPUs: two ranks land on one GPU, which NCCL refuses
    ("Duplicate GPU detected"); the rung says so in one line and exits 2."""
    command = launchers.torchrun(max(GPUS + 1, 2), f"scaledl.ladder.{module}",
                                 ["--epochs", "1", "--train-limit", "2048", "--out-dir", str(tmp_path)])
    env = launchers.local_env(GPUS + 1, dict(os.environ))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert lines and all("two ranks share one GPU" in line for line in lines), result.stderr[-3000:]
    assert not any(line.startswith("[rank") and "Traceback" in line for line in result.stderr.splitlines())
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("rung", ["tensor_parallel", "fsdp_tp"])
def test_tensor_parallel_rungs_hold_their_share_of_the_default_transformer(rung, tmp_path):
    """The transformer at its default size (about 101M parameters: 1.2 GB of parameters, gradients and
    momentum) split over this node's GPUs with NCCL; each rank holds what scaledl.meshes computes."""
    import math

    from conftest import run
    from scaledl import meshes
    from scaledl.models import TRANSFORMER_DEFAULTS

    if rung == "fsdp_tp" and GPUS < 2:
        pytest.skip("a 2D mesh needs 2 GPUs")
    tp = meshes.tp_in_node(TRANSFORMER_DEFAULTS["heads"], GPUS if rung == "tensor_parallel" else GPUS // 2)
    nproc = tp if rung == "tensor_parallel" else GPUS - GPUS % tp
    options = ["--tp", str(tp)] if rung == "fsdp_tp" else []
    command = launchers.torchrun(nproc, f"scaledl.ladder.{rung}", [*options, "--epochs", "1", "--train-limit", "1024",
                                                                  "--out-dir", str(tmp_path)])
    run(command, timeout=900, nproc=nproc)
    summary = json.loads(Path(tmp_path, "summary.json").read_text())
    sizes = {k: v for k, v in TRANSFORMER_DEFAULTS.items() if k != "heads"}
    expected = 3 * meshes.param_bytes_per_rank(**sizes, tp=tp, dp=nproc // tp)
    assert summary["world_size"] == nproc and summary.get("params_in_sync", nproc == 1) is True  # 1 rank: no peer
    assert math.isclose(summary["state_bytes_per_rank"], expected, rel_tol=0.01)  # FSDP2 pads uneven shards


def test_binding_check_reads_this_nodes_gpus():
    """Each GPU's PCI address and NUMA node from the real sysfs; a process pinned to the GPU's NUMA
    node is `local`, one pinned to another NUMA node `far` (where the node has more than one)."""
    import torch

    from scaledl import devices
    from scaledl.hpc import binding

    kind = devices.accelerator()
    nodes = {node: cpus & os.sched_getaffinity(0) for node, cpus in binding.numa_nodes().items()}
    nodes = {node: cpus for node, cpus in nodes.items() if cpus}
    before = os.sched_getaffinity(0)
    try:
        for index in range(GPUS):
            device = torch.device(kind, index)
            address, why = binding.device_address(device)
            assert address in binding.gpus(), (address, why, binding.gpus())
            home = binding.gpu_numa_node(address)
            if home is None or home not in nodes:
                continue  # one NUMA node, or the GPU's node holds none of our CPUs
            os.sched_setaffinity(0, nodes[home])
            assert binding.this_rank(device, local_rank=index).verdict == "local"
            others = [cpus for node, cpus in nodes.items() if node != home]
            if others:
                os.sched_setaffinity(0, others[0])
                assert binding.this_rank(device, local_rank=index).verdict == "far"
    finally:
        os.sched_setaffinity(0, before)



@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
@pytest.mark.parametrize("stage", [0, 3])
def test_deepspeed_where_each_rank_sees_only_its_own_gpu(stage):
    """Polaris' affinity wrapper (and `srun --gpus-per-task=1`) shows a rank only its own GPU, as cuda:0,
    while LOCAL_RANK stays the rank's place on the node.  DeepSpeed sets the device from LOCAL_RANK
    (and ZeRO-3 builds cuda:<LOCAL_RANK>): the probe, one rank on GPU 0 told LOCAL_RANK=1, builds the
    engine as the DeepSpeed rung does and steps it; without `distributed.deepspeed_sees` it fails with
    an invalid device ordinal on a 1-GPU node."""
    from conftest import reports, run

    probe = ROOT / "tests" / "probes" / "deepspeed_device_probe.py"
    result = run([sys.executable, str(probe), str(stage)], timeout=600, nproc=1, env={"CUDA_VISIBLE_DEVICES": "0"})
    [found] = reports(result.stdout)
    assert found["engine_device"] == "cuda:0" and found["local_rank"] == "0" and found["steps"] == 2


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_deepspeed_ranks_that_outnumber_the_gpus_train_on_the_cpu(tmp_path):
    """One rank more than the node's GPUs (lesson 8's 2 ranks on a 1-GPU node): `local_env` hides the
    GPUs and says DS_ACCELERATOR=cpu, DeepSpeed's launcher shows them again (its CPU accelerator sets
    CUDA_VISIBLE_DEVICES to the local slots), and the rung must still follow DeepSpeed onto the CPU.
    Before the fix it failed with "No backend type associated with device type cpu" (NCCL's group,
    DeepSpeed's CPU model)."""
    world_size = GPUS + 1
    command = launchers.deepspeed(world_size, "scaledl.ladder.deepspeed",
                                  ["--epochs", "1", "--train-limit", "512", "--out-dir", str(tmp_path)])
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=launchers.local_env(world_size))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"on {world_size} ranks, cpu" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_allocator_sees_the_activations_the_formula_predicts(recompute):
    """What the forward leaves for backward, read from the GPU's allocator, against scaledl.activations
    (the CPU count matches the formula to the byte; the allocator rounds each block up to 512 bytes)."""
    import torch

    from scaledl import activations, models

    device = torch.device("cuda", 0)
    seq_len, batch, width, depth, heads = 512, 4, 256, 4, 8
    model = models.gpt(width, depth, heads, seq_len, recompute=recompute).to(device)
    tokens = torch.randint(0, models.VOCAB_SIZE, (batch, seq_len), device=device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    logits = model(tokens)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated(device) - before - logits.numel() * logits.element_size()
    predicted = activations.model_bytes(seq_len, batch, width, depth, heads, recompute)
    assert grown == pytest.approx(predicted, rel=0.02), (grown, predicted)


def test_pytorchs_ring_attention_equals_full_attention_on_the_gpus():
    """torch's context_parallel (scaledl.context_parallel.torch_attention) on one rank per GPU, up to 2:
    the ring's output, gathered back, equals full attention, with and without the causal mask."""
    from conftest import reports, run

    ranks = min(GPUS, 2)
    found = reports(run(launchers.torchrun(ranks, "cp_probe", []), timeout=600, nproc=ranks).stdout)
    assert [r["rank"] for r in found] == list(range(ranks)) and found[0]["device"] == "cuda"
    for report in found:
        for causal in (False, True):
            difference = report[f"causal={causal}"]
            assert isinstance(difference, float) and difference < 1e-4, (causal, difference)


def test_the_language_model_reaches_its_mfu_in_bf16(tmp_path):
    """GPT-2 small's shape in bf16 on one GPU: the summary's MFU against the table's peak.  The
    Ultra-Scale Playbook's best shown at scale is 46.7%; one H100 or H200 should reach 40%."""
    import torch

    command = [sys.executable, "-m", "scaledl.ladder.single_torch", "--model", "gpt", "--preset", "gpt2-small",
               "--precision", "bf16", "--batch-size", "16", "--max-steps", "60", "--log-interval", "10",
               "--out-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    print(f"MFU {summary['mfu']:.3f} at {summary['tokens_per_s']:,.0f} tokens/s ({summary['peak_source']})")
    assert "spec" in summary["peak_source"], summary["peak_source"]  # a device the table knows
    name = torch.cuda.get_device_name(0)
    if "H100" in name or "H200" in name:
        assert summary["mfu"] >= 0.40, summary
    else:
        assert summary["mfu"] > 0.05, summary


def test_the_guard_costs_no_host_sync(tmp_path):
    """--on-nonfinite stop keeps its verdict on the GPU; skip reads it every step: stop is at least as fast."""
    rates = {}
    for policy in ("skip", "stop", "skip", "stop"):
        out = tmp_path / f"{policy}{len(rates)}"
        command = [sys.executable, "-m", "scaledl.ladder.single_torch", "--model", "gpt", "--preset", "small",
                   "--batch-size", "8", "--max-steps", "100", "--log-interval", "25", "--on-nonfinite", policy,
                   "--out-dir", str(out)]
        subprocess.run(command, check=True, capture_output=True, timeout=900)
        rates.setdefault(policy, []).append(json.loads((out / "summary.json").read_text())["samples_per_s"])
    print({policy: max(found) for policy, found in rates.items()})
    assert max(rates["stop"]) >= 0.97 * max(rates["skip"]), rates
