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

.PHONY: setup demo test lab exercises clean

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml constraints.txt tools/setup.sh tools/setup_site.sh tools/site_report.py \
		tools/build_horovod.sh tools/build_deepspeed.sh tools/pins.py tools/install_chromium.sh
	SCALEDL_SYSTEM="$(SYSTEM)" HOROVOD="$(HOROVOD)" bash tools/setup.sh
	touch $@

demo: setup
	$(BIN)/scaledl demo --out-dir runs/demo --overwrite

# Notebooks run top to bottom on real kernels and real ranks; a failing cell fails the build.
test: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --nbval-lax --nbval-current-env \
		tests solutions $(wildcard notebooks/*.ipynb)

# Prints the address to open and the lessons' table, then serves until Ctrl-C (PORT=8899 make lab).
lab: setup
	bash tools/lab.sh

exercises: setup
	$(BIN)/scaledl exercises --solutions solutions --out exercises

clean:
	rm -rf $(VENV) runs
