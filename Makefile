# The two commands of the README:
#   make demo   build, write a sample dataset, stream it through the loader,
#               print throughput and a latency histogram
#   make test   every test: Rust, Python, the API reference, the examples, and a
#               short run of each fuzz target
# Both install what they need (Rust crates through cargo, a project-local
# virtual environment with maturin, numpy, pytest and the test peers).

SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
FUZZ_SECONDS ?= 15

# maturin builds pyo3 with PYO3_PYTHON, PYO3_ENVIRONMENT_SIGNATURE and
# PYO3_BUILD_EXTENSION_MODULE set. A cargo command that sees other values re-runs
# pyo3's build script and recompiles pyo3, numpy and zring-py, and the next
# maturin build recompiles them back (minutes each way: this is what made
# `make docs` after `make test` a second compile). So every cargo command here
# that compiles pyo3 runs with maturin's values (by hand: prefix it with
# `env $$(make -s pyo3-env)`), and zring-py has no Rust test, doctest or bench
# target, so cargo test and bench never link it.
PYO3_ENV = PYO3_PYTHON=$(abspath $(PY)) PYO3_BUILD_EXTENSION_MODULE=1 \
	PYO3_ENVIRONMENT_SIGNATURE=$$($(PY) -c 'import struct, sys; v = sys.version_info; print("%s-%d.%d-%dbit" % (sys.implementation.name, v.major, v.minor, 8 * struct.calcsize("P")))')

.PHONY: demo test bench venv pyo3-env develop develop-release develop-bench rust-test py-test fuzz lint doc docs clean

$(VENV)/.ok: py/requirements-dev.txt
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r py/requirements-dev.txt
	touch $@

venv: $(VENV)/.ok

pyo3-env: venv
	@echo $(PYO3_ENV)

# The package, built in the test profile (the workspace's dev profile is
# optimised; one profile keeps CI to one build of every crate).
develop: venv
	$(VENV)/bin/maturin develop --quiet

develop-release: venv
	$(VENV)/bin/maturin develop --release --quiet

demo: develop-release
	$(PY) scripts/demo.py

lint: venv
	cargo fmt --all -- --check
	$(PYO3_ENV) cargo clippy --workspace --all-targets -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --exclude zring-py

# The Python API reference, built from the docstrings with warnings as errors;
# open docs/_build/html/index.html.
docs: develop
	$(PY) -m sphinx -W --keep-going -q -E -b html docs docs/_build/html

# The reliability suites (zring-tests) run on their own so their counts
# (kills, crash states, fault points) reach the log.
rust-test:
	cargo test --workspace --exclude zring-tests
	cargo test -p zring-tests -- --nocapture
	ZRING_BACKEND=pread cargo test -p zring-tests -- --nocapture
	cargo test -p zring-engine --features fault-injection --test faults --test full_disk --test power_loss --test uring_faults --test parts_faults -- --nocapture

PYTEST = $(PY) -m pytest -q $(1); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

py-test: develop
	$(call PYTEST,py/tests)
	ZRING_BACKEND=pread $(call PYTEST,py/tests/test_fork.py py/tests/test_fd_limit.py py/tests/test_interrupt.py py/tests/test_load.py py/tests/test_corruption.py py/tests/test_errors.py py/tests/test_sigbus.py py/tests/test_cache.py)

fuzz:
	bash fuzz/run.sh $(FUZZ_SECONDS)

test: lint rust-test doc docs py-test fuzz
	cargo bench --workspace --no-run --profile dev
	@echo "make test: all suites passed"

# Benchmarks (release build; data in $$ZRING_BENCH_DIR or ./bench-data, never /tmp).
# The peers compare.py measures against are installed here, not in `make test`.
# The benchmarks' build: release, with the ceilings (the `bench` feature).
develop-bench: venv
	$(VENV)/bin/maturin develop --release --features bench --quiet

bench: develop-bench
	$(PIP) install --quiet lmdb h5py zarr tensorstore blosc2 array-record grain pylance matplotlib
	ZRING_BENCH_COLD_GIB=$${ZRING_BENCH_COLD_GIB:-5} cargo bench -p zring-benches
	$(PY) benches/compare.py
	$(PY) benches/budget.py
	$(PY) benches/host.py

clean:
	cargo clean
	rm -rf $(VENV)
