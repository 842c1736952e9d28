# Every target that needs the environment depends on .venv/.ready, which tools/setup.sh
# rebuilds only when pyproject.toml, the pins or the build scripts change.
# SYSTEM=polaris or aurora: a venv over the site's framework module (tools/setup_site.sh); HOROVOD=1
# also builds Horovod against the module's torch.
VENV := .venv
BIN := $(VENV)/bin
SYSTEM ?=
HOROVOD ?= 0
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup demo test check lab exercises architecture clean

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml constraints.txt tools/setup.sh tools/setup_site.sh tools/site_report.py \
		tools/build_horovod.sh tools/build_deepspeed.sh tools/pins.py tools/install_chromium.sh
	SCALEDL_SYSTEM="$(SYSTEM)" HOROVOD="$(HOROVOD)" bash tools/setup.sh
	touch $@

demo: setup
	$(BIN)/scaledl demo --out-dir runs/demo --overwrite

# Every tier that can run here (slow multi-process runs, the Slurm cluster, MPICH, the browser, GPUs
# where there are some; each skips with one line where it cannot), two tests at a time and then the
# `serial` ones alone (tools/test.sh), the ten slowest tests and the time per tier.
# Notebooks run top to bottom on real kernels and real ranks; a failing cell fails the build.
test: setup
	bash tools/test.sh

# The edit-test loop, under 4 minutes: the unit tests (no tier marker, two at a time), one short run of every rung
# with its own launcher (scaledl demo), and the lessons' checks (tests/workshop/checks/, unmarked).
CHECK_TIERS := not slow and not slurm and not mpich and not browser and not gpu
check: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --durations=5 -n 2 --dist loadfile \
		-m "$(CHECK_TIERS) and not serial" tests
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -m "$(CHECK_TIERS) and serial" tests
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/scaledl demo --out-dir runs/check --overwrite \
		--epochs 1 --train-limit 512 --log-interval 2

# Prints the address to open and the lessons' table, then serves until Ctrl-C (PORT=8899 make lab).
lab: setup
	bash tools/lab.sh

exercises: setup
	$(BIN)/scaledl exercises --solutions solutions --out exercises

# docs/architecture.md, drawn from the package's imports (tests/test_architecture.py checks it is current).
architecture:
	python3 tools/architecture.py

clean:
	rm -rf $(VENV) runs
