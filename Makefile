# The two commands of the README: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_FLAGS := --disable-pip-version-check -q

.PHONY: venv run lint test test-quick bench proto image cluster-up cluster-down clean

$(STAMP): setup.cfg pyproject.toml constraints.txt common/tf_startup.py wafer/compiled.py
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -c constraints.txt -e '.[test]'
	$(PY) -m common.tf_startup >/dev/null  # TensorFlow's start-up chatter off the terminal
	$(PY) -m wafer.compiled  # the simulator's compiled tiles, cached (wafer/__pycache__)
	touch $(STAMP)

venv: $(STAMP)

# FC-MNIST on the embedded default: a chief and an input worker streaming to an embedded
# simulated CS system; then the test accuracy of the final checkpoint, evaluated on the CS.
run: $(STAMP)
	cd examples/fc_mnist && export PATH=$(abspath $(VENV))/bin:$$PATH \
	  && csrun_wse --tasks-per-node 2 --job-dir csrun_jobs/make-run python run.py --mode train \
	  && csrun_wse --job-dir csrun_jobs/make-run-eval python run.py --mode eval --eval_steps 3

# ruff (rules in pyproject.toml) over the repo; mypy (its [tool.mypy]) over the packages.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# Two lanes at once (the machine has two cores and the cluster lane spends much of its time
# waiting on Slurm, containers and subprocesses): the cluster lane (Slurm, multinode,
# container, then the end-to-end and launcher runs, subprocesses too, one at a time) logs to
# $(LANE_LOG), shown when both have ended; then both lanes take the other test files from
# one queue (tests/lane_queue.py: a file runs whole in the lane that claims it first), so
# they end together; the test fails if either lane fails.
CLUSTER_TIERS := slurm or multinode or container
CLUSTER_LANE_TESTS := tests/e2e tests/launcher
LANE_LOG := .cache/test-cluster-lane.log
LANE_QUEUE := .cache/test-lane-queue
QUEUED := -m "not ($(CLUSTER_TIERS))" -p lane_queue --lane-queue $(LANE_QUEUE) $(CLUSTER_LANE_TESTS:%=--ignore=%)
test: lint
	@rm -rf $(LANE_QUEUE); mkdir -p .cache; echo "cluster lane: $(LANE_LOG)"
	@( $(PY) -m pytest -q --durations=10 -m "$(CLUSTER_TIERS)"; tiers=$$?; \
	   $(PY) -m pytest -q --durations=10 -m "not ($(CLUSTER_TIERS))" $(CLUSTER_LANE_TESTS); own=$$?; \
	   $(PY) -m pytest -q --durations=10 $(QUEUED); exit $$(( tiers || own || $$? )) ) \
	  > $(LANE_LOG) 2>&1 & lane=$$!; \
	$(PY) -m pytest -q --durations=15 $(QUEUED); rest=$$?; \
	wait $$lane; cluster=$$?; echo "---- cluster lane ----"; cat $(LANE_LOG); \
	echo "in-process lane exit $$rest, cluster lane exit $$cluster"; exit $$(( rest || cluster ))

test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not slurm"

# The Charliecloud directory image from containers/csrun.def (containers/image.py); rebuilt
# only when the recipe, the pins or the sources it copies change. Root installs the tools.
IMAGE ?= .cache/csrun-image
image: $(STAMP)
	@command -v ch-run >/dev/null && command -v mmdebstrap >/dev/null \
	  || DEBIAN_FRONTEND=noninteractive apt-get install -y -q charliecloud-runtime mmdebstrap
	$(PY) -m containers.image --image $(IMAGE)

bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH)

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. cs_api/cs_api.proto

clean:
	rm -rf $(VENV) build *.egg-info

# A real Slurm (slurm/cluster/cluster.sh; root: installs what is missing). NODES=0 (default):
# one host on loopback; NODES=N: N hosts node1..N as network namespaces on a bridge and the CS
# system (wse_sim serve) on a host of its own (see README, "Several nodes").
# Then: export SLURM_CONF=$${CSRUN_SLURM_DIR:-/tmp/csrun-slurm}/etc/slurm.conf
NODES ?= 0
cluster-up: $(STAMP)
	CSRUN_SLURM_NODES=$(NODES) CSRUN_PYTHON=$(abspath $(PY)) slurm/cluster/cluster.sh up
	@slurm/cluster/cluster.sh env

cluster-down:
	slurm/cluster/cluster.sh down
