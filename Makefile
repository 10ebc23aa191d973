# The two commands: `make run` and `make test`. Both install what is missing (Debian packages,
# the pinned ggml, cached outside the checkout) and build first.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps configure build test run clean bench-kv

all: build

deps:
	@mkdir -p $(BUILD_DIR) && scripts/deps.sh > $(BUILD_DIR)/ggml-dir
	@scripts/peer.sh > $(BUILD_DIR)/peer-dir
	@scripts/npm-client.sh > $(BUILD_DIR)/npm-dir

configure: deps
	@gen=; command -v ninja >/dev/null && [ ! -f $(BUILD_DIR)/Makefile ] && gen="-G Ninja"; \
	launcher=; command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"; \
	cmake -S . -B $(BUILD_DIR) $$gen $$launcher -Dggml_DIR="$$(cat $(BUILD_DIR)/ggml-dir)" -DOFFGRAPH_PEER_DIR="$$(cat $(BUILD_DIR)/peer-dir)" > $(BUILD_DIR)/configure.log \
	  || { cat $(BUILD_DIR)/configure.log; exit 1; }

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# The main job: the server, with the small Muse Glimmer model trained on the King James Bible
# that ships in models/ (tools/train recreates it).
DEFAULT_MODEL ?= models/muse-glimmer-kjv.gguf
PORT ?= 8080

run: build
	$(BUILD_DIR)/bin/offgraph serve -m $(DEFAULT_MODEL) --port $(PORT)

# Decode-attention benchmark at Muse Glimmer shapes; writes docs/kv-attention.md.
bench-kv: build
	$(BUILD_DIR)/bin/kv_attention_bench --benchmark_out=$(BUILD_DIR)/kv_attention.json --benchmark_out_format=json
	python3 bench/kv_attention_report.py $(BUILD_DIR)/kv_attention.json > docs/kv-attention.md
	@echo "wrote docs/kv-attention.md"

clean:
	rm -rf $(BUILD_DIR)

# offgraph against the pinned llama.cpp (issue 7): builds what it needs in build-bench/, writes
# docs/benchmarks.md and docs/plots/ (about 30 min; BENCH_ARGS=--quick for a 5-minute check).
.PHONY: bench
bench:
	python3 bench/run $(BENCH_ARGS)
