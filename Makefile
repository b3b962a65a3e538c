# glassformer — two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv/ at the repository root and install the project into it from nothing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
GF := $(VENV)/bin/glassformer
STAMP := $(VENV)/.installed
MODEL ?= runs/default

.PHONY: demo test lint bench bench-quick bench-gpu venv clean notebook

venv: $(STAMP)

# torch 2.13.0 first (the CPU build lies on local disk), then the project with a range it satisfies.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(GF) lesson
	$(GF) verify
	@if [ -f $(MODEL)/config.json ]; then \
		echo "== the translator in $(MODEL): finishing its training if it was interrupted"; \
		$(GF) train --out $(MODEL) --resume; \
	else \
		echo "== training the default translator into $(MODEL) (about 8-10 minutes on 2 CPU cores)"; \
		$(GF) train --preset default --out $(MODEL); \
	fi
	$(GF) evaluate --model $(MODEL) --split test --beam 4
	$(GF) explain --model $(MODEL) "我昨天给了他一本书。" --target "I gave him a book yesterday."
	$(GF) translate --model $(MODEL) --beam 4 "我昨天给了他一本书。" "他昨天给了我一本书。" "我喜欢喝茶。" "你明天去学校吗？"

# The lesson as notebooks (notebooks/README.md): installs the `notebook` extra, opens JupyterLab there;
# e.g. `make notebook JUPYTER_ARGS="--no-browser --port 9000"`.
JUPYTER_ARGS ?=
notebook: $(STAMP)
	$(PY) -m pip install --quiet -e ".[notebook]"
	$(VENV)/bin/jupyter lab $(JUPYTER_ARGS) notebooks/

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) -m benchmarks.run

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) -m benchmarks.run --quick

bench-gpu: $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) -m benchmarks.gpu

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
