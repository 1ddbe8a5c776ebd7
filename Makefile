# Two commands: `make run` (the demo) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The dev extra (make test, lint, unit, bench*), and the demo extra alone (make run).
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: run run-digits test test-extended lint unit bench bench-adaptive bench-declarative bench-lightning bench-adversarial bench-strategies bench-cluster bench-launch bench-tune bench-allreduce bench-scheduler bench-scheduler-real bench-hosts clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Reinstall when the dependency list or the pins change. Each stamp says what its own
# install gave: make run's (the demo extra) never stands for make test's (dev).
$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	# AdaptDL 0.2.11, only for tests/adaptive/test_adaptdl_goodput.py (its own goodput tests run
	# against raylight.adaptive): in a folder of its own, not site-packages, so that elsewhere the
	# environment is one without AdaptDL, where `import adaptdl` is raylight's layer.
	$(PIP) install -q --no-deps --target $(VENV)/adaptdl-tests adaptdl==0.2.11
	touch $(STAMP)

$(DEMO_STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[demo]"
	touch $(DEMO_STAMP)

run: $(DEMO_STAMP)
	$(PY) examples/declarative/demo.py

run-digits: $(STAMP)
	$(PY) examples/digits.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples bench
	$(VENV)/bin/mypy

# Two pytest runs at once: the timing-sensitive Ray tests in front, the rest beside at
# lower CPU priority (tests/suite.py; docs/testing.md).
test: lint
	$(PY) -m tests.suite

# The peers' own programs run whole (AdaptDL's examples, Horovod's test file): minutes each,
# so not in `make test` (tests/suite.py EXTENDED).
test-extended: $(STAMP)
	$(VENV)/bin/pytest -m extended

unit: $(STAMP)
	$(VENV)/bin/pytest -m "unit or distributed"

bench: $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[bench]"
	$(PY) bench/overhead.py

bench-adaptive: $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[bench,examples]"
	$(PY) bench/adaptive.py

bench-declarative: $(STAMP)
	$(PY) bench/declarative.py

bench-allreduce: $(STAMP)
	$(PY) bench/allreduce.py

bench-adversarial: $(STAMP)
	$(PY) bench/adversarial.py

bench-strategies: $(STAMP)
	$(PY) bench/strategies.py

bench-cluster: $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[bench,examples]"
	PYTHONPATH=. $(PY) bench/cluster.py

bench-launch: $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[bench]"
	$(PY) bench/launch.py

bench-tune: $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[bench,tune]"
	$(PY) bench/tune_trials.py

bench-lightning: $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[bench,lightning]"
	$(PY) bench/lightning.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The cluster scheduler's trace-driven simulator on Pollux's workloads (pure, no Ray; issue 58).
bench-scheduler: $(STAMP)
	PYTHONPATH=. $(PY) bench/scheduler.py

# Three adaptive jobs through the scheduler on a fake 3-node loopback cluster, against a fixed share (issue 58).
bench-scheduler-real: $(STAMP)
	PYTHONPATH=src:. $(PY) bench/scheduler_real.py

# Several machines (issue 57): the overhead job across two fake hosts (tests/hosts/harness.py,
# network + mount namespaces: needs root), raylight beside torchrun, and a host's death.
bench-hosts: $(STAMP)
	$(PY) bench/hosts.py
