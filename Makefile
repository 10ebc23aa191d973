# The two commands: `make run` and `make test`. Both install what is missing (Debian packages,
# the pinned ggml, cached outside the checkout) and build first.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CTEST_ARGS ?=
# The clang tree of the libFuzzer targets, the sanitizer tree (docs/reliability.md).
FUZZ_DIR ?= $(BUILD_DIR)-fuzz
ASAN_DIR ?= $(BUILD_DIR)-asan
# The CUDA build (docs/gpu.md): ggml with its CUDA backend, offgraph portable (x86-64-v3).
CUDA_DIR ?= $(BUILD_DIR)-cuda
CUDA_TARGETS ?= offgraph gpu_tests
FUZZ_SECONDS ?= 20
FUZZ_TIME ?= 600

.PHONY: all deps configure build test run replicas clean bench-kv bench-agents fuzz-configure fuzz-build fuzz-long soak test-asan cuda-configure cuda test-cuda

all: build

deps:
	@mkdir -p $(BUILD_DIR) && scripts/deps.sh > $(BUILD_DIR)/ggml-dir
	@scripts/peer.sh > $(BUILD_DIR)/peer-dir
	@scripts/npm-client.sh > $(BUILD_DIR)/npm-dir
	@scripts/npm-client.sh agents-sdk > $(BUILD_DIR)/npm-agents-sdk-dir
	@scripts/agent-clients.sh > $(BUILD_DIR)/agent-clients-dir

configure: deps
	@gen=; command -v ninja >/dev/null && [ ! -f $(BUILD_DIR)/Makefile ] && gen="-G Ninja"; \
	launcher=; command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"; \
	cmake -S . -B $(BUILD_DIR) $$gen $$launcher -Dggml_DIR="$$(cat $(BUILD_DIR)/ggml-dir)" -DOFFGRAPH_PEER_DIR="$$(cat $(BUILD_DIR)/peer-dir)" > $(BUILD_DIR)/configure.log \
	  || { cat $(BUILD_DIR)/configure.log; exit 1; }

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every test of the main tree, then each fuzz target for FUZZ_SECONDS (label `fuzz` in both trees).
test: build fuzz-build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) $(CTEST_ARGS)
	ctest --test-dir $(FUZZ_DIR) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# The libFuzzer targets: our code built by clang with -fsanitize=fuzzer-no-link,address,undefined
# against the same cached ggml; only the targets and the libraries they need are built.
fuzz-configure: deps
	@mkdir -p $(FUZZ_DIR); gen=; command -v ninja >/dev/null && [ ! -f $(FUZZ_DIR)/Makefile ] && gen="-G Ninja"; \
	launcher=; command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"; \
	cmake -S . -B $(FUZZ_DIR) $$gen $$launcher -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOFFGRAPH_FUZZ=ON -DOFFGRAPH_BUILD_TESTS=OFF \
	  -DOFFGRAPH_FUZZ_SECONDS=$(FUZZ_SECONDS) -Dggml_DIR="$$(cat $(BUILD_DIR)/ggml-dir)" > $(FUZZ_DIR)/configure.log \
	  || { cat $(FUZZ_DIR)/configure.log; exit 1; }

fuzz-build: fuzz-configure
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_all

# Each fuzz target for FUZZ_TIME seconds (default 600), FUZZ_JOBS at a time, keeping what they find
# in $(FUZZ_LONG_DIR)/<target>/corpus (outside the checkout) across runs; each run is appended to
# fuzz/record.tsv and the cumulative record rewritten into docs/reliability.md:
#     make fuzz-long FUZZ_TIME=3600 FUZZ_JOBS=2
FUZZ_JOBS ?= $(JOBS)
FUZZ_LONG_DIR ?= $(HOME)/.cache/offgraph/fuzz-long
fuzz-long: fuzz-build
	FUZZ_TIME=$(FUZZ_TIME) FUZZ_LONG_DIR=$(FUZZ_LONG_DIR) FUZZ_RECORD=$(CURDIR)/fuzz/record.tsv \
	  ctest --test-dir $(FUZZ_DIR) --output-on-failure -j $(FUZZ_JOBS) -L fuzz -R '[.]run$$' \
	  --timeout $$(( $(FUZZ_TIME) + 600 )); rc=$$?; \
	  cat $(FUZZ_LONG_DIR)/*/stats.txt; python3 fuzz/record.py fuzz/record.tsv docs/reliability.md; exit $$rc

# The server soak (docs/reliability.md, "Soak"): SOAK_REQUESTS requests from 32 clients on
# loopback (every ctest run sends 1,200). SOAK_DIR=build-asan runs it under the sanitizers.
SOAK_REQUESTS ?= 20000
SOAK_DIR ?= $(BUILD_DIR)
soak: build
	cmake --build $(SOAK_DIR) --target server_soak_tests
	OFFGRAPH_SOAK_REQUESTS=$(SOAK_REQUESTS) ctest --test-dir $(SOAK_DIR) -R '^ServerSoak[.]' \
	  --output-on-failure -V --timeout 3600 > $(SOAK_DIR)/soak.log 2>&1; rc=$$?; \
	  grep -E '\[ soak|Passed|Failed|Failure|tests passed' $(SOAK_DIR)/soak.log; exit $$rc

# The whole suite with AddressSanitizer and UndefinedBehaviorSanitizer on our code (gcc; ggml and
# the llama.cpp peer stay uninstrumented), at -O1 (a third less compile time than -O2; ASan's own
# recommendation). ASAN_CTEST_ARGS narrows it, like CTEST_ARGS; CI passes -LE 'peer|agents' (.ci/run).
ASAN_CTEST_ARGS ?=
test-asan: deps
	@mkdir -p $(ASAN_DIR); gen=; command -v ninja >/dev/null && [ ! -f $(ASAN_DIR)/Makefile ] && gen="-G Ninja"; \
	launcher=; command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"; \
	cmake -S . -B $(ASAN_DIR) $$gen $$launcher -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DOFFGRAPH_SANITIZE=address,undefined \
	  -Dggml_DIR="$$(cat $(BUILD_DIR)/ggml-dir)" -DOFFGRAPH_PEER_DIR="$$(cat $(BUILD_DIR)/peer-dir)" > $(ASAN_DIR)/configure.log \
	  || { cat $(ASAN_DIR)/configure.log; exit 1; }
	cmake --build $(ASAN_DIR) -j $(JOBS)
	UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --test-dir $(ASAN_DIR) --output-on-failure -j $(JOBS) $(ASAN_CTEST_ARGS)

# The CUDA build: scripts/deps.sh --cuda builds ggml with its CUDA backend once (about 25 CPU
# minutes; OFFGRAPH_CUDA_ARCHS, default 90), then offgraph's CUDA_TARGETS against it in
# $(CUDA_DIR). Needs nvcc, not a GPU: without one the binary runs on the CPU and says why.
# `make test-cuda` runs the `gpu` label there (each GPU test skips without a GPU, saying why).
cuda-configure:
	@mkdir -p $(CUDA_DIR) && scripts/deps.sh --cuda > $(CUDA_DIR)/ggml-dir
	@gen=; command -v ninja >/dev/null && [ ! -f $(CUDA_DIR)/Makefile ] && gen="-G Ninja"; \
	launcher=; command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"; \
	cmake -S . -B $(CUDA_DIR) $$gen $$launcher -Dggml_DIR="$$(cat $(CUDA_DIR)/ggml-dir)" \
	  -DOFFGRAPH_NATIVE_KERNELS=OFF -DOFFGRAPH_KERNEL_MARCH=x86-64-v3 > $(CUDA_DIR)/configure.log \
	  || { cat $(CUDA_DIR)/configure.log; exit 1; }

cuda: cuda-configure
	cmake --build $(CUDA_DIR) -j $(JOBS) --target $(CUDA_TARGETS)

test-cuda: cuda
	ctest --test-dir $(CUDA_DIR) --output-on-failure -j $(JOBS) -L gpu $(CTEST_ARGS)

# The main job: the server, with the small Muse Glimmer model trained on the King James Bible
# that ships in models/ (tools/train recreates it).
DEFAULT_MODEL ?= models/muse-glimmer-kjv.gguf
PORT ?= 8080

run: build
	$(BUILD_DIR)/bin/offgraph serve -m $(DEFAULT_MODEL) --port $(PORT)

# REPLICAS servers of the default model behind nginx on PORT, with conversation affinity
# (deploy/replicas; docs/backends.md).
REPLICAS ?= 2
replicas: build
	deploy/replicas -n $(REPLICAS) -p $(PORT) -m $(DEFAULT_MODEL) --offgraph $(BUILD_DIR)/bin/offgraph

# Decode-attention benchmark at Muse Glimmer shapes; writes docs/kv-attention.md.
bench-kv: build
	$(BUILD_DIR)/bin/kv_attention_bench --benchmark_out=$(BUILD_DIR)/kv_attention.json --benchmark_out_format=json
	python3 bench/kv_attention_report.py $(BUILD_DIR)/kv_attention.json > docs/kv-attention.md
	@echo "wrote docs/kv-attention.md"

clean:
	rm -rf $(BUILD_DIR)

# offgraph against the pinned llama.cpp: builds what it needs in build-bench/; bench/run writes
# docs/benchmarks.md and docs/plots/ (about 30 min), then bench/pages (8 min), bench/prefix
# (32 min), bench-grammar (10 min), bench/speculative, bench/backends, bench/vision, and Gemma 4's
# bench/gemma4 (16 min), bench/prefix --arch gemma4 and bench/cpu_kernels below. BENCH_ARGS go to bench/run; --quick
# also shortens the others.
.PHONY: bench bench-pages bench-prefix bench-grammar bench-speculative bench-backends bench-vision bench-gemma4 bench-cpu-kernels
bench:
	python3 bench/run $(BENCH_ARGS)
	python3 bench/pages
	python3 bench/prefix $(filter --quick,$(BENCH_ARGS))
	@$(MAKE) --no-print-directory bench-grammar BENCH_ARGS='$(filter --quick,$(BENCH_ARGS))'
	python3 bench/speculative $(filter --quick,$(BENCH_ARGS))
	python3 bench/backends $(filter --quick,$(BENCH_ARGS))
	python3 bench/vision $(filter --quick,$(BENCH_ARGS))
	python3 bench/gemma4 $(filter --quick,$(BENCH_ARGS))
	python3 bench/prefix --arch gemma4 $(filter --quick,$(BENCH_ARGS))
	python3 bench/cpu_kernels $(filter --quick,$(BENCH_ARGS))

# Gemma 4 (issue 35): E2B- and 31B-shaped q8_0 files beside llama.cpp, tokens/s at depths 0/4K/16K
# and K/V bytes at 4K/16K/64K (about 15 min): docs/gemma4-bench.md; then the agent scenarios of
# bench/prefix on the E2B-shaped file: docs/prefix-cache-bench-gemma4.md.
bench-gemma4:
	python3 bench/gemma4 $(filter --quick,$(BENCH_ARGS))
	python3 bench/prefix --arch gemma4 $(filter --quick,$(BENCH_ARGS))

# CPU matrix kernels (issue 36): AMX q8_0 tiles, ggml's path (--no-amx) and llama.cpp on three q8_0
# files, pp512, 9-token verify spans and tg32 (about 15 min): docs/cpu-kernels-bench.md.
bench-cpu-kernels:
	python3 bench/cpu_kernels $(filter --quick,$(BENCH_ARGS))

# Layers over ggml-rpc beside llama-bench --rpc, and 1 against 2 replicas behind nginx (issue 18):
# docs/backends-bench.md. Builds a second llama.cpp peer with GGML_RPC the first time.
bench-backends:
	python3 bench/backends $(BENCH_ARGS)

# Image encode time and peak memory at 256, 1,024 and 4,096 image tokens beside llama.cpp's mtmd
# on the same synthetic mmproj, and time to first token of an image prompt (first, again, the
# conversation continued) beside llama-server --mmproj (issue 19; about 27 min):
# docs/vision-bench.md and docs/plots/vision_encode.png. Builds vision_encode_bench in build-bench/.
bench-vision:
	python3 bench/vision $(BENCH_ARGS)

# Speculative decoding against llama-server's (issue 17; about 8 min): decode tokens/s plain, with
# n-gram drafts (adaptive and fixed length) and llama-server's ngram-simple and ngram-mod on the
# trained model, and the cost of a verify step on the 1b preset: docs/speculative-bench.md and
# docs/plots/verify_cost.png.
bench-speculative:
	python3 bench/speculative $(BENCH_ARGS)

# Paged against contiguous flat KV storage, paced pairs (about 8 min): docs/kv-paging-bench.md.
bench-pages:
	python3 bench/pages

# Recorded Claude Code and Codex sessions replayed through offgraph and llama-server (issue 34;
# about 3 min): docs/agents-bench.md. `python3 bench/agents/run --record` records them anew.
bench-agents: build
	python3 bench/agents/run

# Prefix reuse on agent workloads against llama-server (issue 15; about 32 min):
# docs/prefix-cache-bench.md and docs/plots/prefix_cache.png.
bench-prefix:
	python3 bench/prefix

# Structured output (issue 16): offgraph's grammar masks against llama.cpp's grammar sampler on the
# same schemas, and decode with and without a JSON Schema (about 10 min): builds its three targets
# in build-bench/, then docs/structured-output-bench.md. BENCH_ARGS go to bench/grammar/run.py.
bench-grammar:
	@$(MAKE) --no-print-directory configure BUILD_DIR=build-bench
	cmake --build build-bench -j $(JOBS) --target grammar_bench llama_grammar_bench offgraph
	python3 bench/grammar/run.py --build-dir build-bench $(BENCH_ARGS)
