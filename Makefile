# Two commands on a fresh machine: `make demo` (set-up + the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv demo test test-gpu info check bench clean

$(VENV)/.installed: pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh

venv: $(VENV)/.installed

demo: venv
	$(PY) -m jfa demo

test: venv
	$(PY) -m pytest -q $(shell $(PY) -c "import xdist" 2>/dev/null && echo "-n 2") $(PYTEST_ARGS)

# The GPU tests alone (on the H200): make test-gpu
test-gpu: venv
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

info: venv
	$(PY) -m jfa info

check: venv
	$(PY) -m jfa check

bench: venv
	$(PY) -m jfa bench --out benchmarks/results/latest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
