# Set-up and checks. Everything installs into .venv from PyPI, pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := trainer,trainer-deepspeed,trainer-mlflow,trainer-comet,serving,examples,sandbox,docs,dev

.PHONY: setup browser k8s k8s-up k8s-down demo test bench lint clean sandbox-e2e docs docs-serve

setup: $(STAMP) browser

# Chromium draws `michelangelo runs report` pages in the test suite (a real headless browser).
# Installed from the OS packages only when missing, and only where apt-get runs as root.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends chromium >/dev/null; \
	  else echo "note: install Chromium (Debian package 'chromium') for the report's browser test"; fi; }

# The installer is uv (pinned in constraints.txt), installed into the venv by pip: it fetches
# and unpacks wheels in parallel, which takes the cold set-up (torch's CUDA build and its nvidia
# wheels, about 3 GB) from eight to ten minutes to about one. Where uv cannot be installed, pip
# does the same installs from the same constraints (INSTALL falls back to it). uv compiles the
# bytecode at install time, as pip does (--compile-bytecode). Its default leaves that to the
# first import, and where PYTHONDONTWRITEBYTECODE is set (this machine sets it) nothing is ever
# written: every process, each Ray worker included, then compiled torch, Ray and Lightning
# again, and imports took three times as long.
installer = $$(test -x $(BIN)/uv && echo "$(BIN)/uv pip install --compile-bytecode --python $(1)/bin/python" \
  || echo "$(1)/bin/python -m pip install") --quiet
uninstaller = $$(test -x $(BIN)/uv && echo "$(BIN)/uv pip uninstall --python $(1)/bin/python" \
  || echo "$(1)/bin/python -m pip uninstall -y") --quiet
INSTALL = $(call installer,$(VENV))

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt uv || \
	  echo "note: uv could not be installed; pip installs instead (slower)"
	# torch first, pinned: PyPI's build of 2.13.0 (CUDA wheels included; it runs on the CPU).
	$(INSTALL) -c constraints.txt "torch==2.13.0"
	$(INSTALL) -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

# The `lightning` package beside the venv, not in it: a test gives it to its Ray workers only,
# as on machines that have both Lightning packages (Ray then builds its Lightning classes on it).
LIGHTNING_SIDE := $(VENV)/side-lightning
$(LIGHTNING_SIDE)/.installed: $(STAMP)
	$(INSTALL) --no-deps --upgrade --target $(LIGHTNING_SIDE) -c constraints.txt lightning
	touch $@

# A second venv with the `lightning` package alone: no pytorch_lightning anywhere. Since 2.6,
# `lightning` lists pytorch-lightning among its requirements, so every pip install of it brings
# both; this venv removes pytorch-lightning afterwards, as an image trimmed to one package
# would, to show that a `lightning` run never reaches for the other package. uv links the
# wheels from its cache, so this costs seconds once the main venv is installed.
ONLY_LIGHTNING := $(VENV)/only-lightning
$(ONLY_LIGHTNING)/.installed: $(STAMP)
	test -x $(ONLY_LIGHTNING)/bin/python || $(PYTHON) -m venv $(ONLY_LIGHTNING)
	$(call installer,$(ONLY_LIGHTNING)) -c constraints.txt "torch==2.13.0" -e . lightning \
	  safetensors pytest pytest-timeout
	$(call uninstaller,$(ONLY_LIGHTNING)) pytorch-lightning
	touch $@

demo: setup
	$(BIN)/python examples/quickstart/workflow.py

# The KubeRay test bed's binaries, built once from the Go module proxy into ~/.cache/michelangelo:
# kube-apiserver, kube-controller-manager, kube-scheduler v1.36, the etcd they require, and the
# KubeRay operator v1.7.0, or v1.6.2 where v1.7.0 cannot be built (tools/build_kuberay_bed.sh;
# needs Go >= 1.26).
k8s:
	bash tools/build_kuberay_bed.sh

# The same test bed the KubeRay tests use (control plane, the real operator, the kubelet double
# with two nodes), outside pytest: k8s-up returns once the operator is ready and prints
# `export KUBECONFIG=...`; k8s-down stops it.
k8s-up: setup k8s
	@$(BIN)/python -m tools.kuberay_bed up

k8s-down:
	@$(BIN)/python -m tools.kuberay_bed down

# Every test run (tools/make_test.sh says which and why): the main run in one lane; in a second
# lane beside it, the bed's binaries build, then the KubeRay bed run, the lightning_packages run
# with both Lightning packages installed, and the only-lightning run; in a third, the kind
# sandbox's images build (at low priority), and the sandbox run comes last (SANDBOX_E2E=0 leaves
# it out). Each step's start is stamped in the log; each run's per-test times land in
# build/junit-*.xml.
SANDBOX_E2E ?= 1
test:
	@BIN=$(BIN) LIGHTNING_SIDE=$(LIGHTNING_SIDE) ONLY_LIGHTNING=$(ONLY_LIGHTNING) MAKE="$(MAKE)" \
	  SANDBOX_E2E=$(SANDBOX_E2E) bash tools/make_test.sh

# The documentation site (mkdocs.yml, docs/): built offline into build/site; --strict turns
# broken links, missing anchors and pages left out of the navigation into errors. The test
# suite builds it too (tests/docs/), and runs every code block of its pages and the README.
docs: setup
	$(BIN)/mkdocs build --strict --site-dir build/site

docs-serve: setup
	$(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8001

bench: setup
	bash bench/run_all.sh

lint: setup
	$(BIN)/ruff check michelangelo tests bench examples

# The kind sandbox for real (see docs/sandbox.md): a Docker engine (started here, and stopped
# afterwards, only when none answers: tools/docker_engine.sh), then the end-to-end tests make
# test runs too (tests/sandbox/e2e): doctor, create, status, a capacity refusal, Ctrl-C while
# a RayCluster provisions, the quickstart serving as a RayService, and delete, which leaves
# nothing behind. SANDBOX_CREATE defaults to building every image on this machine (no image
# registry needed); set it empty to pull the published images instead.
SANDBOX_CREATE ?= --build-images
sandbox-e2e: setup
	@bash tools/docker_engine.sh start || exit 1; status=0; \
	SANDBOX_CREATE="$(SANDBOX_CREATE)" $(BIN)/python -m pytest -s -q -p no:cacheprovider \
	  -m sandbox tests/sandbox/e2e || status=$$?; \
	bash tools/docker_engine.sh stop; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info
