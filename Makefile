# Two commands set up a fresh machine (see README): `make demo` and `make test`.
# Both create .venv on first use and install Eroica with every extra into it.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[stream,sink,import,test]'
	touch $@

demo: setup
	$(VENV)/bin/eroica demo

test: setup
	$(PY) -m pytest

bench: setup
	$(VENV)/bin/eroica bench throughput

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
