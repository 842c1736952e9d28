"""A lesson's Polaris recipe is the job script's header and module lines and the launch line
`scaledl launch --system polaris --dry-run` prints, not a copy typed beside them."""
import shlex
import subprocess

import pytest

from conftest import ROOT
from scaledl.hpc import launchers
from scaledl.workshop import recipes
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


def dry_run(nranks: int, ppn: int, *target: str, system: str = "polaris") -> list[str]:
    result = subprocess.run([launchers.tool("scaledl"), "launch", "--system", system, "-n", str(nranks),
                             "--ppn", str(ppn), "--dry-run", "--", *target], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, check=True)
    lines = [line.split("  # ")[0] for line in result.stdout.splitlines() if not line.startswith("# ")]
    # The printed command runs the launching Python by its full path; the recipe's venv is active.
    python = next(word for word in shlex.split(lines[-1]) if word.endswith("/python"))
    return [line.replace(f" {python} ", f" {recipes.PYTHON} ") for line in lines]


def test_the_launch_lines_are_what_scaledl_launch_prints():
    recipe = recipes.polaris("ddp", "--epochs", "1", full=True).splitlines()
    printed = dry_run(8, 4, "scaledl.ladder.ddp", "--epochs", "1")
    assert recipe[-len(printed):] == printed
    assert printed[-1].startswith("mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth ")
    assert "CUDA_VISIBLE_DEVICES=$((3 - r % 4))" in printed[-1]  # local rank r on GPU 3 - r, its NUMA node's


def test_the_full_recipe_is_a_complete_job_script_to_submit(tmp_path):
    """Lesson 0 says to save the full printout as a file and submit it: a shell line first, every #PBS
    line before the first command (PBS reads no directive after one), bash accepts it, and it ends
    with the launch itself."""
    text = recipes.polaris("ddp", full=True)
    lines = text.splitlines()
    assert lines[0] == (ROOT / "jobs" / "polaris" / "ddp.sh").read_text().splitlines()[0] == "#!/bin/bash -l"
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert [line for line in lines if line.startswith("#PBS ")] == lines[2:first_command] == recipes.header("ddp")
    assert "qsub -A YOUR_PROJECT FILE submits it" in lines[1]
    script = tmp_path / "ddp.sh"
    script.write_text(text + "\n")
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert lines[-1].startswith("mpiexec -n 8 --ppn 4 ") and lines[-1].endswith(" python -m scaledl.ladder.ddp")


def test_the_folded_recipe_is_the_full_one_with_its_exports_as_one_comment():
    """Lesson 0 prints the job with its export lines folded: one comment counting them, and every command of the
    full script, in order, the mpiexec line last."""
    full = recipes.polaris("ddp", full=True).splitlines()
    folded = recipes.polaris("ddp", full=True, fold_exports=True).splitlines()
    exports = [line for line in full if line.startswith("export ")]
    assert len(exports) == 9 and not any(line.startswith("export ") for line in folded)
    comment = ("# 9 exports: 7 network settings, the GPU numbering and the plugin path "
               "(the presets table says what each does)")
    assert folded.count(comment) == 1
    commands = [line for line in full if line and not line.startswith(("#", "export "))]
    assert [line for line in folded if line and not line.startswith("#")] == commands
    assert folded[-1] == full[-1] and folded[-3] == comment and folded[-2].endswith('under "The mpiexec line":')


def test_the_exports_comment_names_what_is_not_a_network_setting():
    network = recipes.exports_comment(["export NCCL_NET=x", "export FI_PROVIDER=cxi"])
    assert network == "# 2 exports: 2 network settings (the presets table says what each does)"
    aurora = recipes.exports_comment(["export CCL_KVS_MODE=mpi", "export ZE_FLAT_DEVICE_HIERARCHY=FLAT",
                                      "export ZE_ENABLE_PCI_ID_DEVICE_ORDER=1"])
    assert aurora == "# 3 exports: 1 network setting and the GPU numbering (the presets table says what each does)"


def test_the_live_ranks_run_as_the_engines_do():
    recipe = recipes.polaris("ddp", live_ranks=4, full=True).splitlines()
    assert recipe[1] == ("qsub -I -A YOUR_PROJECT -q debug -l select=1:system=polaris -l walltime=01:00:00 "
                         "-l filesystems=home:eagle")
    assert recipe[3] == dry_run(4, 4, "ipyparallel.engine")[-1]


def test_the_model_parallel_recipes_keep_tensor_parallelism_inside_a_node():
    two_d = recipes.polaris("fsdp_tp", full=True).splitlines()
    assert "#PBS -l select=2:system=polaris" in two_d  # FSDP2 across the two nodes
    assert two_d[-1] == dry_run(8, 4, "scaledl.ladder.fsdp_tp", "--tp", "4")[-1]  # tp = a node's 4 GPUs
    assert recipes.polaris("tensor_parallel", full=True).splitlines()[-1].startswith("mpiexec -n 4 --ppn 4 ")
    assert recipes.polaris("pipeline", full=True).splitlines()[-1].startswith("mpiexec -n 2 --ppn 2 ")  # 2 stages


@pytest.mark.parametrize("system, rung", [("polaris", "ddp"), ("polaris", "horovod_tf"), ("aurora", "horovod_tf"),
                                          ("aurora", "zero3")])
def test_the_short_form_is_the_full_recipes_job_launch_and_nodes(system, rung):
    full = recipes.recipe(rung, "--epochs", "1", live_ranks=4, system=system).splitlines()
    short = recipes.recipe(rung, "--epochs", "1", live_ranks=4, system=system, full=False).splitlines()
    # The short form ends with the script's `scaledl launch` line, which runs the full recipe's mpiexec line.
    launch = shlex.split(short[-1])
    assert launch[:3] == ["scaledl", "launch", "--system"] and "--dry-run" not in launch
    assert dry_run(int(launch[launch.index("-n") + 1]), int(launch[launch.index("--ppn") + 1]),
                   *launch[launch.index("--") + 1:], system=system)[-1] == full[-1]
    assert "CUDA_VISIBLE_DEVICES" not in "\n".join(short)  # the GPU wrapper: lesson 0's pages only
    # The live ranks named in one comment (lesson 0 gives their interactive job); then the script to submit, with
    # the full recipe's node request.
    assert short[0] == "# this notebook's 4 live ranks: engines.start(4) in lesson 0's interactive job on one node"
    assert full[1].startswith("qsub -I ") and not [line for line in short if "qsub -I" in line]
    select = [line for line in full if line.startswith("#PBS -l select=")]
    assert len(select) == 1 and short[1].startswith(f"qsub -A YOUR_PROJECT jobs/{system}/{rung}.sh  # ") \
        and f"({select[0]})" in short[1]
    assert not [line for line in short if line.startswith("export ")] and len(short) <= (6 if "module load" in
                                                                                      "\n".join(short) else 3)
    # A rung with modules of its own (Aurora's TensorFlow) says so; the others leave lesson 0's out.
    assert any("module load" in line for line in short) == ((system, rung) == ("aurora", "horovod_tf"))


def test_a_rung_without_a_job_is_one_line():
    with pytest.raises(UserError, match="no Polaris job for 'ddpp': use one of single_torch"):
        recipes.polaris("ddpp")


@pytest.mark.parametrize("rung", ["ddp", "deepspeed", "zero3", "fsdp_tp"])
def test_the_aurora_recipe_is_the_aurora_job_script(rung):
    script = (ROOT / "jobs" / "aurora" / f"{rung}.sh").read_text().splitlines()
    recipe = recipes.aurora(rung, full=True).splitlines()
    pbs = [line for line in script if line.startswith("#PBS ")]
    assert [line for line in recipe if line.startswith("#PBS ")] == pbs
    assert "#PBS -l filesystems=home:flare" in recipe and "module load frameworks" in recipe
    assert "source .venv/bin/activate  # the venv `make setup SYSTEM=aurora` made in your clone" in recipe
    printed = dry_run(24, 12, *recipes.job(rung, "aurora").target, system="aurora")
    assert recipe[-len(printed):] == printed
    assert recipe[-1].startswith("mpiexec -n 24 --ppn 12 ")


@pytest.mark.parametrize("rung", ["horovod_tf", "single_tf"])
def test_the_aurora_tensorflow_recipe_sources_the_venv_its_job_script_uses(rung):
    script = (ROOT / "jobs" / "aurora" / f"{rung}.sh").read_text()
    recipe = recipes.aurora(rung)
    assert "SCALEDL_VENV=${SCALEDL_VENV:-$PWD/.venv-tf}" in script
    assert "source .venv-tf/bin/activate  # made once: module load tensorflow" in recipe
    assert "source .venv/bin/activate" not in recipe


def test_the_aurora_live_ranks_take_a_node_of_12_tiles():
    recipe = recipes.aurora("ddp", live_ranks=12, full=True).splitlines()
    assert recipe[1] == ("qsub -I -A YOUR_PROJECT -q debug -l select=1 -l walltime=01:00:00 "
                         "-l filesystems=home:flare")
    assert recipe[3].startswith("mpiexec -n 12 --ppn 12 ") and "ipyparallel.engine" in recipe[3]


def test_the_polaris_node_figure_shows_the_recipes_binding():
    fig = recipes.polaris_node_figure()
    assert fig.local_counts == {"a Polaris node under the recipe's mpiexec line": 4}
    texts = [text.get_text() for text in fig.axes[0].texts]
    labels = sorted(text for text in texts if text.startswith("rank ") and ": CPUs" in text)  # not "rank 0's" GPU
    assert labels == ["rank 0: CPUs 0-7", "rank 1: CPUs 8-15", "rank 2: CPUs 16-23", "rank 3: CPUs 24-31"]


@pytest.mark.parametrize("system", ["polaris", "aurora"])
def test_the_presets_table_is_what_scaledl_launch_dry_run_exports(system):
    import re

    ppn = 4 if system == "polaris" else 12
    result = subprocess.run([launchers.tool("scaledl"), "launch", "--dry-run", "--system", system, "-n", str(2 * ppn),
                             "--ppn", str(ppn), "--", "scaledl.ladder.ddp"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, check=True)
    exports = [line.removeprefix("export ").split("  # ", 1) for line in result.stdout.splitlines()
               if line.startswith("export ")]
    presets, sources = recipes.presets_table(system).split("\n\nSources:\n")
    lines, sources = presets.splitlines(), sources.splitlines()
    assert lines[0::2] == [variable for variable, _ in exports]  # every export, in the printed order
    assert sources == [f"[{n}] {source.split('] ', 1)[1]}" for n, source in enumerate(sources, 1)]
    assert len({source.split("] ", 1)[1] for source in sources}) == len(sources)  # each source listed once
    cited = set()
    for (_, note), line in zip(exports, lines[1::2]):
        reason, numbers = re.fullmatch(r" {4}(.+) \[(\d+(?:, \d+)*)\]", line).groups()
        assert note.startswith(reason)  # the printed reason, its library's page moved to the sources
        for number in map(int, numbers.split(", ")):
            assert sources[number - 1].split("] ", 1)[1] in note
            cited.add(number)
    assert cited == set(range(1, len(sources) + 1))
    if system == "polaris":
        assert lines[2] == "NCCL_NET='AWS Libfabric'" and "[2] ALCF user guide, Polaris" in sources[1]
