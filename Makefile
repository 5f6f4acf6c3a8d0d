# Two commands set up a fresh machine (see README): `make demo` and `make test`.
# Both create .venv on first use. `make demo` installs only what the demo needs (the stack's
# extras: the broker, the stream workers, the ClickHouse sink; no torch, no test tools);
# `make test`, `make check`, `make lint` and the rest install Eroica with every extra.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
DEMO_EXTRAS := stream,sink
FULL_EXTRAS := stream,sink,import,test,gpu,fuzz,fast,docs

.PHONY: setup setup-demo kafka demo test check lint bench docs clean

setup: $(VENV)/.installed kafka

# Apache Kafka's jars (deploy/kafka/pom.xml) for the broker tests and `eroica up --broker kafka`;
# a no-op once installed. Without java and mvn the tests fall back to tansu (the Kafka ones skip).
kafka:
	@if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then \
		bash .ci/install-kafka.sh; \
	else \
		echo "java or mvn not found: Apache Kafka not installed (its tests skip; eroica up uses tansu)"; \
	fi

# The full install (every extra and torch; about 6 GB): its own stamp, which the demo's light one
# below does not satisfy. It also stamps the light one (a superset of it).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[$(FULL_EXTRAS)]'
	$(PY) -m pip install -q torch==2.13.0  # the tracer's tests (CPU wheel on these machines; not an extra: torch>=2.1 would pick 2.14)
	$(PY) -c 'from eroica.models import fastjson, limits; from eroica.streams.detection import kernels; fastjson.warm(); kernels.warm(); limits.warm()'  # compile the scanner, the summariser's kernels and the msgpack depth walk once, into their caches
	touch $@ $(VENV)/.installed-demo

# The demo's light install (about 1.1 GB, most of it chdb; a few minutes on a first run), with pip's
# own progress (what it downloads and installs) and one line per step.
setup-demo: $(VENV)/.installed-demo

$(VENV)/.installed-demo: pyproject.toml
	@echo "==> [1/3] creating $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/3] updating pip"
	$(PY) -m pip install -U pip
	@echo "==> [3/3] installing Eroica with the demo's extras [$(DEMO_EXTRAS)]: about 1.1 GB (chdb is most of it), no torch"
	$(PY) -m pip install -e '.[$(DEMO_EXTRAS)]'
	@echo "==> installed; starting the demo"
	touch $@

demo: $(VENV)/.installed-demo
	$(VENV)/bin/eroica demo

# Everything: what CI runs (.ci/run).
test: setup lint
	$(PY) -m pytest

# The fast tier for work in progress (under 2 minutes): lint, then the unit tests that are not slow
# (tiers: the root conftest.py; `pytest -m integration`, `-m chaos`, `-m slow` run the others).
check: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "unit and not slow" -x -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: setup
	$(VENV)/bin/eroica bench throughput

# The documentation site into build/site; strict: a broken link, a missing anchor or a page left out
# of the nav fails (tests/test_docs.py runs the same build under `make test`).
docs: setup
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
