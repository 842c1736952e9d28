"""The environment `make setup` builds: every framework, built the way the ladder needs it."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, reports, run, tool
from scaledl.hpc import launchers



def pins_module():
    spec = importlib.util.spec_from_file_location("pins", ROOT / "tools" / "pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def constraints(python: tuple[int, int] | None = None) -> dict[str, str]:
    """name -> exact version, from constraints.txt (what `make setup` installs on this Python, or on `python`)."""
    return {name: pin.split("==")[1] for name, pin in pins_module().constraints(python).items()}


def every_python() -> list[tuple[int, int]]:
    low, high = pins_module().SUPPORTED
    return [(3, minor) for minor in range(low[1], high[1] + 1)]


def pyproject_requirements() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]


def test_pyproject_has_ranges_and_constraints_pin_each_within_them():
    from packaging.requirements import Requirement

    for python in every_python():
        exact = constraints(python)
        assert all(re.fullmatch(r"[a-z0-9_.\-]+", name) and re.fullmatch(r"[0-9][0-9a-z.+]*", version)
                   for name, version in exact.items()), exact
        for text in pyproject_requirements():
            requirement = Requirement(text)
            name = requirement.name.lower()
            # An exact pin in the package's metadata would downgrade a user's environment on install.
            assert not any(spec.operator == "==" for spec in requirement.specifier), \
                f"pyproject.toml pins {text} exactly: give the range it works with, and the pin to constraints.txt"
            assert name in exact, f"constraints.txt has no pin for {name} on Python {python}"
            assert requirement.specifier.contains(exact[name], prereleases=True), \
                f"constraints.txt pins {name}=={exact[name]} for Python {python}, outside pyproject.toml's {text}"
        names = {Requirement(text).name.lower() for text in pyproject_requirements()}
        assert set(exact) <= names, f"constraints.txt pins what pyproject.toml does not need: {set(exact) - names}"


def test_pip_reads_the_markers_of_constraints_txt_as_pins_py_does():
    # pip decides what `make setup` installs; tools/pins.py what it builds Horovod against and what
    # these tests expect.  Both read the same lines, and must agree for every supported Python.
    from packaging.markers import Marker

    pins = pins_module()
    lines = pins.pin_lines()
    assert any(marker for _, marker in lines), "constraints.txt has no per-Python line"
    for python in every_python():
        environment = {"python_version": f"{python[0]}.{python[1]}"}
        by_pip = {pin for pin, marker in lines if not marker or Marker(marker).evaluate(environment)}
        assert by_pip == set(pins.constraints(python).values()), python


def test_environment_yml_names_the_same_packages_and_versions():
    text = (ROOT / "environment.yml").read_text()
    python = tuple(int(x) for x in re.search(r"- python=(\d+)\.(\d+)", text).groups())
    pip_section = text.split("- pip:", 1)[1]
    found = re.findall(r"^\s+- ([A-Za-z0-9_.\-]+==[^\s]+)\s*$", pip_section, re.M)
    conda_pins = dict(pin.lower().split("==") for pin in found)
    # Horovod is built by tools/build_horovod.sh (the comment at the top of environment.yml says how).
    expected = {name: version for name, version in constraints(python).items() if name != "horovod"}
    assert conda_pins == expected
    assert "conda-forge" in text and "defaults" not in text


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    for name, pinned in constraints().items():
        installed = version(name)
        # torch's CPU wheel carries a local label: 2.13.0+cpu satisfies ==2.13.0.
        assert installed.split("+")[0] == pinned, f"{name} {installed} installed, {pinned} pinned"


@pytest.mark.slow  # horovodrun starts and loads every framework: about 12 s
def test_horovod_check_build_has_tensorflow_pytorch_mpi_and_gloo():
    output = subprocess.run([tool("horovodrun"), "--check-build"], capture_output=True, text=True,
                            check=True).stdout
    for feature in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert re.search(rf"\[X\] {feature}\b", output), f"{feature} missing from:\n{output}"


def test_horovod_extensions_really_load():
    # --check-build prints [X] PyTorch even when the extension failed to import; import both.
    code = ("import horovod.torch.mpi_lib_v2; from horovod.tensorflow import mpi_ops; "
            "import horovod.torch as hvd; print(hvd.mpi_built(), hvd.gloo_built())")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.split() == ["True", "True"]


def test_deepspeed_cpu_ops_are_prebuilt():
    code = ("from deepspeed.ops.op_builder import CPUAdamBuilder, ShareMemCommBuilder; "
            "import deepspeed.ops.adam.cpu_adam; "
            "print(CPUAdamBuilder().is_compatible(), ShareMemCommBuilder().is_compatible())")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env=launchers.local_env(1))
    import deepspeed.ops

    installed = Path(deepspeed.ops.__file__).parent
    assert list(installed.rglob("cpu_adam*.so")), "cpu_adam was not compiled into the wheel"


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "tf"])
@pytest.mark.parametrize("launch", ["horovodrun-gloo", "horovodrun-mpi", "mpirun"])
def test_horovod_two_process_allreduce(framework, launch):
    if launch == "mpirun":
        command = launchers.mpirun(2, "horovod_probe", [framework])
    else:
        command = launchers.horovodrun(2, "horovod_probe", [framework], controller=launch.split("-")[1])
    found = reports(run(command, timeout=300).stdout)
    assert [r["rank"] for r in found] == [0, 1]
    assert all(r["world_size"] == 2 and r["allreduce_sum"] == 3.0 for r in found)
    assert all(r["mpi"] == (launch != "horovodrun-gloo") for r in found)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["deepspeed", "torchrun"])
def test_deepspeed_two_process_step(launch):
    command = launchers.for_launcher(launch, 2, "deepspeed_probe", ["1"])
    found = reports(run(command, timeout=400).stdout)
    assert [r["rank"] for r in found] == [0, 1]
    assert found[0]["world_size"] == 2
    # ZeRO-1 shards optimizer state; after the step both ranks must hold the same parameters.
    assert found[0]["param_sum"] == pytest.approx(found[1]["param_sum"], abs=0)


def test_shell_scripts_pass_shellcheck():
    scripts = sorted(str(p) for p in (ROOT / "tools").glob("*.sh")) + [str(ROOT / ".ci" / "run")]
    # SC2155 (export X=$(cmd) masks cmd's status) is accepted for `nproc`, which cannot fail.
    result = subprocess.run([tool("shellcheck"), "--severity=warning", "--exclude=SC2155", *scripts],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
