# Two commands set up a fresh machine (see README): `make demo` and `make test`.
# Both create .venv on first use and install Eroica with every extra into it.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: setup kafka demo test lint bench docs clean

setup: $(VENV)/.installed kafka

# Apache Kafka's jars (deploy/kafka/pom.xml) for the broker tests and `eroica up --broker kafka`;
# a no-op once installed. Without java and mvn the tests fall back to tansu (the Kafka ones skip).
kafka:
	@if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then \
		bash .ci/install-kafka.sh; \
	else \
		echo "java or mvn not found: Apache Kafka not installed (its tests skip; eroica up uses tansu)"; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[stream,sink,import,test,gpu,fuzz,fast,docs]'
	$(PY) -m pip install -q torch==2.13.0  # the tracer's tests (CPU wheel on these machines; not an extra: torch>=2.1 would pick 2.14)
	$(PY) -c 'from eroica.models import fastjson, limits; from eroica.streams.detection import kernels; fastjson.warm(); kernels.warm(); limits.warm()'  # compile the scanner, the summariser's kernels and the msgpack depth walk once, into their caches
	touch $@

demo: setup
	$(VENV)/bin/eroica demo

test: setup lint
	$(PY) -m pytest

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
