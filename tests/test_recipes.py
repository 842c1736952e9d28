"""A lesson's Polaris recipe is the job script's header and module lines and the launch line
`scaledl launch --system polaris --dry-run` prints, not a copy typed beside them."""
import shlex
import subprocess

import pytest

from conftest import ROOT
from scaledl import launchers, recipes
from scaledl.errors import UserError

RUNGS = ["single_torch", "horovod_tf", "horovod_torch", "ddp", "deepspeed", "zero3", "pipeline", "tensor_parallel",
         "fsdp_tp"]


@pytest.mark.parametrize("rung", RUNGS)
def test_the_header_and_modules_are_the_committed_job_scripts(rung):
    script = (ROOT / "jobs" / "polaris" / f"{rung}.sh").read_text().splitlines()
    header = recipes.header(rung)
    assert header == [line for line in script if line.startswith("#PBS ")]
    assert "#PBS -l filesystems=home:eagle" in header and "#PBS -q debug" in header
    assert any(line.startswith("#PBS -l select=") and line.endswith(":system=polaris") for line in header)
    commands = recipes.module_lines(rung)[-1].split("; ")
    assert commands == ["module use /soft/modulefiles", "module load conda", "conda activate base"]
    assert all(f"    {command}" in script for command in commands)


def dry_run(nranks: int, ppn: int, *target: str) -> list[str]:
    result = subprocess.run([launchers.tool("scaledl"), "launch", "--system", "polaris", "-n", str(nranks),
                             "--ppn", str(ppn), "--dry-run", "--", *target], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, check=True)
    lines = [line.split("  # ")[0] for line in result.stdout.splitlines() if not line.startswith("# ")]
    # The printed command runs the launching Python by its full path; the recipe's venv is active.
    python = shlex.split(lines[-1])[shlex.split(lines[-1]).index("gpu-bind") + 1]
    return [line.replace(f" {python} ", f" {recipes.PYTHON} ") for line in lines]


def test_the_launch_lines_are_what_scaledl_launch_prints():
    recipe = recipes.polaris("ddp", "--epochs", "1").splitlines()
    printed = dry_run(8, 4, "scaledl.ladder.ddp", "--epochs", "1")
    assert recipe[-len(printed):] == printed
    assert printed[-1].startswith("mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth ")
    assert "CUDA_VISIBLE_DEVICES=$((3 - r % 4))" in printed[-1]  # local rank r on GPU 3 - r, its NUMA node's


def test_the_live_ranks_run_as_the_engines_do():
    recipe = recipes.polaris("ddp", live_ranks=4).splitlines()
    assert recipe[1] == ("qsub -I -A YOUR_PROJECT -q debug -l select=1:system=polaris -l walltime=01:00:00 "
                         "-l filesystems=home:eagle")
    assert recipe[3] == dry_run(4, 4, "ipyparallel.engine")[-1]


def test_the_model_parallel_recipes_keep_tensor_parallelism_inside_a_node():
    two_d = recipes.polaris("fsdp_tp").splitlines()
    assert "#PBS -l select=2:system=polaris" in two_d  # FSDP2 across the two nodes
    assert two_d[-1] == dry_run(8, 4, "scaledl.ladder.fsdp_tp", "--tp", "4")[-1]  # tp = a node's 4 GPUs
    assert recipes.polaris("tensor_parallel").splitlines()[-1].startswith("mpiexec -n 4 --ppn 4 ")
    assert recipes.polaris("pipeline").splitlines()[-1].startswith("mpiexec -n 2 --ppn 2 ")  # its 2 stages


def test_a_rung_without_a_job_is_one_line():
    with pytest.raises(UserError, match="no Polaris job for 'ddpp': use one of single_torch"):
        recipes.polaris("ddpp")
