# Two commands matter: `make run` and `make test`. Both set up everything they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_STAMP := $(VENV)/.apt-installed
APT_PACKAGES := mosquitto mosquitto-clients openssl gcc libc6-dev prometheus chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ARGS ?=

.PHONY: install native run test lint bench image clean k8s-testbed simulate fuzz chaos lock \
	container-tools k8s-node test-k8s-e2e

install: $(STAMP) $(APT_STAMP) native

# The hot path compiled with mypyc (tools/build_native.py: a no-op when up to date).
native: $(STAMP) $(APT_STAMP)
	$(PY) tools/build_native.py

# What `make install` installs is requirements.lock: every package the project and its
# extras need, each at one version with its hashes (pip refuses any other file), so a machine
# set up next year gets what the tests passed with. pyproject.toml keeps the ranges the code
# supports. To move to newer versions within them: `make lock` (pip-compile in a venv of its
# own; --upgrade), then `make test`, then commit pyproject.toml and requirements.lock together.
# A new dependency goes into pyproject.toml first, then `make lock`.
LOCK := requirements.lock
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

LOCK_TOOLS := $(VENV)/lock-tools
lock:
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install --quiet pip-tools
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_TOOLS)/bin/pip-compile --quiet --upgrade \
		--generate-hashes --allow-unsafe --all-build-deps --strip-extras \
		--no-emit-index-url --no-emit-find-links --extra test,spark,native,fuzz \
		-o $(LOCK) pyproject.toml

# Debian packages the tests and benchmarks drive: mosquitto_pub/sub, the mosquitto peer,
# openssl for the TLS test's throwaway certificate, and a Java runtime for PySpark; a C
# compiler and the interpreter's headers for the native build; Prometheus (and promtool)
# scraping a live broker, and chromium for the dashboard's browser tests (Playwright).
PY_HEADERS_OK = $(PY) -c "import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
$(APT_STAMP): $(STAMP)
	@if ! command -v mosquitto_sub >/dev/null || [ ! -x /usr/sbin/mosquitto ] || ! command -v openssl >/dev/null || ! command -v java >/dev/null || ! command -v gcc >/dev/null || ! command -v prometheus >/dev/null || ! command -v chromium >/dev/null || ! $(PY_HEADERS_OK); then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $(APT_PACKAGES) \
			$$(command -v java >/dev/null || echo openjdk-17-jre-headless) \
			$$($(PY_HEADERS_OK) || echo python3-dev); \
	fi
	touch $@

run: install
	$(VENV)/bin/broker run $(ARGS)

lint: install
	$(VENV)/bin/ruff check broker tests bench operator spark-apps tools fuzz
	$(VENV)/bin/mypy broker

# A real kube-apiserver + controller-manager (built once from Debian's sources, ~7 min, then
# cached in $(K8S_TESTBED)), plus helm and kubectl, for tests/k8s.
K8S_TESTBED ?= /var/cache/k8s-testbed
export K8S_TESTBED
k8s-testbed:
	@command -v unzip >/dev/null || { $(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends unzip; }
	$(SUDO) env K8S_TESTBED=$(K8S_TESTBED) bash tests/k8s/testbed/build.sh
	$(SUDO) env K8S_TESTBED=$(K8S_TESTBED) bash tests/k8s/testbed/helm.sh

# The node half of the test bed (tests/k8s/testbed/kubelet/): kubelet, kube-proxy and
# kube-scheduler from the same Debian source (~8 min once, then cached), containerd, runc
# and CNI plugins, so the operator's pods really run (tests/k8s_e2e).
k8s-node: container-tools
	$(SUDO) env K8S_TESTBED=$(K8S_TESTBED) bash tests/k8s/testbed/kubelet/build.sh

# tests/container and tests/k8s_e2e run the images (built only when their inputs changed).
# Then, for the whole suite only, the unit and protocol tests once more on the broker as pure
# Python (tools/pure_tests.py: what the NATIVE=0 image runs).
test: install lint k8s-testbed k8s-node image
	$(VENV)/bin/pytest -q $(ARGS)
	$(if $(ARGS),,$(PY) tools/pure_tests.py)

# The slow end-to-end tests on the test bed's node (`make test` runs their short version):
# helm install, scaling with drain, a deleted pod coming back, Prometheus.
test-k8s-e2e: install k8s-testbed k8s-node image
	K8S_E2E=1 $(VENV)/bin/pytest -q tests/k8s_e2e $(ARGS)

# The long Raft simulation (tests/raft/sim.py; `make test` runs a short one): SEEDS seeds of
# STEPS steps each from a random first seed, or FIRST=...; SEED=1234 replays one seed.
SEEDS ?= 40
STEPS ?= 100000
simulate: install
	$(PY) -m tests.raft.sim --steps $(STEPS) $(if $(SEED),--seed $(SEED),--seeds $(SEEDS) $(if $(FIRST),--first $(FIRST)))

# The fuzzers (fuzz/; `make test` runs short ones): atheris over the decoder for FUZZ_SECONDS,
# then PACKETS mutated packets against a live broker. SEED=... runs the same inputs again.
# Needs no native build: atheris sees coverage only in a pure-Python decoder.
FUZZ_SECONDS ?= 60
PACKETS ?= 1000000
fuzz: $(STAMP)
	@seed=$(or $(SEED),$$(( (RANDOM << 15 | RANDOM) + 1 ))); \
	echo "fuzz seed $$seed (again: make fuzz SEED=$$seed)"; \
	$(PY) -m fuzz.decoder --seed $$seed --seconds $(FUZZ_SECONDS) && \
	$(PY) -m fuzz.network --seed $$seed --packets $(PACKETS)

# The long fault run (tools/chaos.py; tests/cluster/jepsen/ runs each fault once): CYCLES
# random faults (100 by default) on 3 real nodes under a checked workload; SEED=... replays
# a run's choices, REPLICATED=1 adds the faults that need replicated Durable Storage,
# BACKEND=raft runs on it (durable_storage.messages.backend = builtin_raft).
chaos: $(STAMP)
	$(PY) tools/chaos.py --cycles $(or $(CYCLES),100) $(if $(SEED),--seed $(SEED)) $(if $(REPLICATED),--replicated) $(if $(BACKEND),--backend $(BACKEND)) $(if $(WORKLOAD),--workload $(WORKLOAD))

# Every benchmark that feeds a table of the README (bench/every_table.py, within 30 minutes:
# fewer rounds where a full run takes several); ARGS="--only results.json" runs some of them.
bench: install
	bench/setup.sh
	$(PY) bench/every_table.py $(ARGS)

# The broker/operator image and the Spark image (tools/image/build.sh): docker where its
# daemon answers, else podman; from python:3.11-slim, or a Debian base made here when no
# registry answers (IMAGE_BASE=... picks one). Rebuilt only when their inputs change;
# tagged :dev and the release (broker/version.py, the chart's appVersion), so `helm install`
# finds them with default values.
# NATIVE=0: the hot path in pure Python.
CONTAINER_PACKAGES := podman runc debootstrap containerd containernetworking-plugins iptables conntrack
container-tools:
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null || ! command -v containerd >/dev/null || [ ! -x /usr/lib/cni/bridge ] || ! command -v iptables >/dev/null || ! command -v conntrack >/dev/null; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $(CONTAINER_PACKAGES); \
	fi

NATIVE ?= 1
IMAGE_BASE ?=
image: container-tools
	$(SUDO) env NATIVE=$(NATIVE) IMAGE_BASE=$(IMAGE_BASE) bash tools/image/build.sh

clean:
	[ ! -x $(PY) ] || $(PY) tools/build_native.py clean
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
