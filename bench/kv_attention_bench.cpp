// One decode step's attention at Muse Glimmer shapes (32 query heads, 2 KV heads, head dim 128),
// through Step::update_and_attend, on a global (flat) layer at 1K/8K/32K history and on a sliding
// layer (ring: window 2048, max_write 512, 2559 rows), with f16 and q8_0 storage. Reports the
// compute time of the attention graph, the bytes of K and V it must read, and how close it comes
// to the memory-bandwidth floor (bytes read / measured read bandwidth); each shape with offgraph's
// grouped decode kernel and with ggml's flash attention (what llama.cpp runs).
//
//   make bench-kv            (writes docs/kv-attention.md)
#include "cache/geometry.h"
#include "kv/step.h"

#include "ggml-alloc.h"
#include "ggml-cpu.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

namespace {

using namespace offgraph;

constexpr int kThreads = 2;
constexpr int kQHeads = 32, kKvHeads = 2, kHeadDim = 128;
constexpr int kWindow = 2048, kMaxWrite = 512;

// Read bandwidth with kThreads threads over a buffer far larger than the caches (best of 5).
double measure_bandwidth() {
  static double cached = 0;
  if (cached > 0) return cached;
  const size_t n = size_t(1) << 27; // 512 MiB of floats
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> sums(kThreads);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        const float *p = buf.data() + n / kThreads * size_t(t);
        float acc[16] = {};
        for (size_t i = 0; i < n / kThreads; i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += p[i + size_t(j)];
        double s = 0;
        for (float a : acc) s += a;
        sums[size_t(t)] = s;
      });
    for (auto &th : threads) th.join();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(sums);
    best = std::max(best, double(n * sizeof(float)) / secs);
  }
  return cached = best;
}

void fill_random(ggml_tensor *t, std::mt19937 &rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t n_per_row = t->ne[0], rows = t->ne[1];
  std::vector<float> src(size_t(n_per_row * rows));
  for (float &x : src) x = d(rng);
  std::vector<uint8_t> dst(ggml_nbytes(t));
  ggml_quantize_chunk(t->type, src.data(), dst.data(), 0, rows, n_per_row, nullptr);
  ggml_backend_tensor_set(t, dst.data(), 0, dst.size());
}

void BM_DecodeAttention(benchmark::State &state) {
  const bool ring = state.range(0) == 1;
  const int32_t history = int32_t(state.range(1));
  const ggml_type type = ggml_type(state.range(2));
  const kv::AttentionKernel kernel =
      state.range(3) == 0 ? kv::AttentionKernel::Grouped : kv::AttentionKernel::Ggml;

  std::vector<cache::LayerSpec> layers = {
      {cache::AttentionKind{ring ? kWindow : 0}, kKvHeads, kHeadDim, kHeadDim}};
  auto layout = cache::Layout::make(cache::Geometry::build(layers, 0).value(),
                                    {history + kMaxWrite, kMaxWrite, 512})
                    .value();
  auto store = kv::KvStore::create(layout, {type, type}, ggml_backend_cpu_buffer_type()).value();
  store->set_attention_kernel(kernel);
  const kv::SeqId seq = *store->create_sequence();
  if (!store->reserve(seq, history + 1).ok()) {
    state.SkipWithError("reserve failed");
    return;
  }
  // Fill the cache with random rows and advance the sequence to `history` without computing.
  std::mt19937 rng(1);
  fill_random(store->k_storage(seq, 0), rng);
  fill_random(store->v_storage(seq, 0), rng);
  cache::Sequence &s = *store->sequence(seq);
  while (s.length() < history) {
    auto plan = s.plan(0, s.length(), std::min(kMaxWrite, history - s.length()));
    (void)s.commit(*plan);
  }

  ggml_backend_t backend = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(backend, kThreads);
  ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
  std::vector<float> q(kQHeads * kHeadDim), k(kKvHeads * kHeadDim), v(kKvHeads * kHeadDim);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto *x : {&q, &k, &v})
    for (float &f : *x) f = d(rng);

  int32_t n_kv = 0;
  double build_seconds = 0;
  for (auto _ : state) {
    auto b0 = std::chrono::steady_clock::now();
    ggml_init_params params = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    ggml_context *ctx = ggml_init(params);
    ggml_cgraph *gf = ggml_new_graph(ctx);
    kv::Step step(*store);
    step.set_graph(gf);
    auto span = step.add_span({seq, history, 1});
    ggml_tensor *tq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kHeadDim, kQHeads, 1);
    ggml_tensor *tk = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kHeadDim, kKvHeads, 1);
    ggml_tensor *tv = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kHeadDim, kKvHeads, 1);
    for (ggml_tensor *t : {tq, tk, tv}) ggml_set_input(t);
    ggml_tensor *out =
        *step.update_and_attend(ctx, tq, tk, tv, *span, 0, 1.0f / std::sqrt(float(kHeadDim)));
    ggml_build_forward_expand(gf, out);
    ggml_gallocr_alloc_graph(galloc, gf);
    ggml_backend_tensor_set(tq, q.data(), 0, ggml_nbytes(tq));
    ggml_backend_tensor_set(tk, k.data(), 0, ggml_nbytes(tk));
    ggml_backend_tensor_set(tv, v.data(), 0, ggml_nbytes(tv));
    step.set_inputs();
    // The K view attended: flash attention's second source, or the grouped kernel's (whose
    // result merges a partial op).
    n_kv = int32_t(out->op == GGML_OP_FLASH_ATTN_EXT ? out->src[1]->ne[1]
                                                     : out->src[0]->src[1]->ne[1]);
    auto c0 = std::chrono::steady_clock::now();
    ggml_backend_graph_compute(backend, gf);
    auto c1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(c1 - c0).count());
    build_seconds += std::chrono::duration<double>(c0 - b0).count();
    (void)step.commit();
    (void)s.rewind(history); // keep the history length fixed
    ggml_free(ctx);
  }
  const double bytes = double(n_kv) * double(kv::k_row_bytes(*layout, 0, {type, type}) +
                                             kv::v_row_bytes(*layout, 0, {type, type}));
  const double bw = measure_bandwidth();
  state.counters["rows_read"] = n_kv;
  state.counters["MB_read"] = bytes / 1e6;
  state.counters["tok/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor_us"] = bytes / bw * 1e6;
  state.counters["bw_GB/s"] = bw / 1e9;
  state.counters["build_us"] = build_seconds / double(state.iterations()) * 1e6;
  state.SetLabel(std::string(ring ? "ring w2048" : "global") + " " + ggml_type_name(type) + " " +
                 (kernel == kv::AttentionKernel::Grouped ? "grouped" : "ggml"));
  ggml_gallocr_free(galloc);
  ggml_backend_free(backend);
}

void Args(benchmark::internal::Benchmark *b) {
  for (int type : {int(GGML_TYPE_F16), int(GGML_TYPE_Q8_0)}) {
    for (int kernel : {0, 1}) { // offgraph's grouped kernel, ggml's flash attention
      for (int history : {1024, 8192, 32768}) b->Args({0, history, type, kernel});
      for (int history : {8192, 32768}) b->Args({1, history, type, kernel});
    }
  }
}

BENCHMARK(BM_DecodeAttention)
    ->Apply(Args)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5);

} // namespace

BENCHMARK_MAIN();
