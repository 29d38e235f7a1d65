# Set-up and checks. Everything installs into .venv from PyPI, pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := trainer,trainer-deepspeed,trainer-mlflow,trainer-comet,serving,examples,sandbox,dev

.PHONY: setup browser k8s demo test bench lint clean sandbox-e2e

setup: $(STAMP) browser

# Chromium draws `michelangelo runs report` pages in the test suite (a real headless browser).
# Installed from the OS packages only when missing, and only where apt-get runs as root.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends chromium >/dev/null; \
	  else echo "note: install Chromium (Debian package 'chromium') for the report's browser test"; fi; }

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: PyPI's build of 2.13.0 (CUDA wheels included; it runs on the CPU).
	$(BIN)/python -m pip install --quiet -c constraints.txt "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: setup
	$(BIN)/python examples/quickstart/workflow.py

# A real Kubernetes control plane (API server, scheduler, etcd) for the KubeRay tests, built
# once from Debian's sources into ~/.cache/michelangelo (K8S_HOME overrides it).
k8s:
	bash tools/build_k8s_control_plane.sh

# The KubeRay tests run in a pytest process of their own: their session keeps a control plane
# and two test doubles running, which no other test should share. They run even when the main
# run fails (so one failure does not hide the rest), and make still fails if either did.
test: setup k8s
	@status=0; \
	$(BIN)/python -m pytest -m "not gpu" -q -p no:cacheprovider --ignore=tests/uniflow/plugins/ray/kuberay/bed \
	  || status=$$?; \
	$(BIN)/python -m pytest -m "not gpu" -q -p no:cacheprovider tests/uniflow/plugins/ray/kuberay/bed || status=$$?; \
	exit $$status

bench: setup
	bash bench/run_all.sh

lint: setup
	$(BIN)/ruff check michelangelo tests bench examples

# The kind sandbox for real (needs Docker, kind, kubectl, helm; see docs/sandbox.md): create it,
# run the quickstart on a RayCluster there, then delete it, also when a step fails.
sandbox-e2e: setup
	@set -e; trap '$(BIN)/michelangelo sandbox delete' EXIT; \
	$(BIN)/michelangelo sandbox doctor; \
	$(BIN)/michelangelo sandbox create; \
	$(BIN)/michelangelo sandbox status; \
	$(BIN)/michelangelo run examples/quickstart/workflow.py:quickstart --kuberay --sandbox \
	  --arg n_rows=1000 --arg epochs=1

clean:
	rm -rf $(VENV) build *.egg-info
