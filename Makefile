# sglang-dspark: the two commands a new machine needs.
#   make demo  - build the tiny local models, serve DSPARK on CPU, run a frontend program
#   make test  - install everything and run the whole suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.sglang-dspark-installed

.PHONY: install demo test test-fast bench clean

install: $(STAMP)

$(STAMP): pyproject.toml packaging/cpu-boot/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e ".[test]" ./packaging/cpu-boot
	touch $(STAMP)

demo: install
	$(PY) -m sglang_dspark.demo

test: install
	$(PY) -m pytest tests

test-fast: install
	$(PY) -m pytest tests -m "not engine"

clean:
	rm -rf $(VENV) artifacts .pytest_cache
