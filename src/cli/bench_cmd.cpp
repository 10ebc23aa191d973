// `offgraph bench`: prefill and decode speed measured as llama-bench measures them, on the real
// model path (model::Forward over a kv::KvStore, as the engine runs it), so the two can be
// compared on the same file. For each depth d, one sequence is first filled with d random tokens
// (untimed, in max_write chunks) and snapshotted; then for each rep the sequence is restored to
// d and either p prompt tokens are computed (chunks of max_write, logits of the last row only:
// test "pp") or n single-token decode steps are run (test "tg"). Before the reps, a warmup runs
// one prompt and one decode step, as llama-bench's does. Flat storage is reserved for the whole
// run before timing (llama.cpp allocates its cache up front). One JSON object per line per test.
//
// `--kv-at L,...` instead reports the K/V bytes one sequence holds at each context length L
// (storage grown to L, rings in full) without computing anything: the store's own accounting.
#include "commands.h"
#include "device_flags.h"

#include "kv/storage_types.h"
#include "model/forward.h"
#include "model/node_profile.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <sys/resource.h>

namespace offgraph::cli {

namespace {

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;
}

Result<std::vector<int32_t>> parse_ints(const std::string &s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      out.push_back(std::stoi(item));
    } catch (...) {
      return Status::error("'" + item + "' is not an integer");
    }
  }
  return out;
}

std::string json_escape(const std::string &s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// --verify: per draft length k, the median time of a step of k + 1 tokens at the depth (every
// row's logits read, as a verify span is), against that of a one-token step; each timed step is
// rewound, so every one runs at the same depth.
Status verify_steps(model::Forward &fwd, kv::KvStore &kv, kv::SeqId seq, const kv::Snapshot &snap,
                    const std::vector<int32_t> &ks, int32_t reps, int32_t depth,
                    const std::string &head,
                    const std::function<std::vector<int32_t>(int32_t)> &random_tokens) {
  constexpr int kStepsPerRep = 16;
  auto median_step = [&](int32_t span) -> Result<double> {
    std::vector<double> times;
    for (int32_t r = 0; r < reps; ++r) {
      OFFGRAPH_TRY(kv.restore(seq, snap));
      for (int i = 0; i < kStepsPerRep; ++i) {
        const int32_t at = kv.sequence(seq)->length();
        model::Batch b;
        b.tokens = random_tokens(span);
        b.spans.push_back({seq, at, span});
        for (int32_t j = 0; j < span; ++j) b.logit_rows.push_back(j);
        const auto start = std::chrono::steady_clock::now();
        auto logits = fwd.run(b);
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (!logits.ok()) return logits.status();
        OFFGRAPH_TRY(kv.rewind(seq, at));
      }
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  for (int32_t k : ks)
    if (k < 0 || k + 1 > kv.layout().max_write())
      return Status::error("--verify lengths must be between 0 and -b - 1 (" +
                           std::to_string(kv.layout().max_write() - 1) + "), not " +
                           std::to_string(k));
  auto one = median_step(1);
  if (!one.ok()) return one.status();
  for (int32_t k : ks) {
    auto t = median_step(k + 1);
    if (!t.ok()) return t.status();
    std::printf("%s,\"test\":\"verify\",\"k\":%d,\"depth\":%d,\"step_s\":%.6f,"
                "\"one_token_step_s\":%.6f,\"ratio\":%.4f}\n",
                head.c_str(), k, depth, *t, *one, *t / *one);
    std::fflush(stdout);
  }
  return ok_status();
}

} // namespace

std::function<int()> add_bench(CLI::App &app) {
  struct Opts {
    std::string model, prompts = "512", gens = "128", depths = "0", kv_at, ctk = "f16", ctv = "f16",
                       attention = "grouped", verify;
    int32_t reps = 5, threads = 2, batch = 512, kv_page = 64, kv_ctx = 0;
    uint64_t seed = 1;
    bool no_warmup = false, paced = false, profile_ops = false, kv_scatter = false;
    DeviceFlags devices;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd = app.add_subcommand(
      "bench", "prefill/decode tokens/s at context depths, as llama-bench (JSON lines)");
  cmd->add_option("-m,--model", o->model, "the GGUF model")->required();
  add_device_flags(*cmd, o->devices);
  cmd->add_option("-p,--n-prompt", o->prompts, "prompt lengths (comma-separated; 0: none)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->gens, "decode lengths (comma-separated; 0: none)")
      ->capture_default_str();
  cmd->add_option("-d,--n-depth", o->depths, "context depths (comma-separated)")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "timed repetitions per test")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  cmd->add_option("-b,--batch", o->batch, "prefill chunk (max_write)")->capture_default_str();
  cmd->add_option("--ctk", o->ctk, "K cache type")->capture_default_str();
  cmd->add_option("--ctv", o->ctv, "V cache type")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the random tokens")->capture_default_str();
  cmd->add_option("--attention", o->attention,
                  "attention kernels: grouped (offgraph's: grouped decode, tiled prefill), "
                  "grouped-decode (ggml's flash attention for prefill) or ggml (flash attention "
                  "everywhere, as llama.cpp)")
      ->capture_default_str();
  cmd->add_flag("--no-warmup", o->no_warmup, "skip the warmup run");
  cmd->add_flag("--paced", o->paced,
                "let the caller interleave runs: print '#wait' and read a line from stdin at the "
                "start and before each timed rep; print '#sample TEST TS' after each rep");
  cmd->add_flag("--profile-ops", o->profile_ops,
                "compute node by node during the timed reps and print the time per kind of node "
                "(weight matrix or op) to stderr; slows every step, so its t/s are not speeds");
  cmd->add_option("--verify", o->verify,
                  "draft lengths k (comma-separated): time one step of k + 1 tokens with every "
                  "row's logits (a speculative verify span) against a one-token step, at each "
                  "depth, instead of the pp/tg tests");
  cmd->add_option("--kv-at", o->kv_at,
                  "only report the K/V bytes held at these context lengths (comma-separated)");
  cmd->add_option("--kv-ctx", o->kv_ctx,
                  "with --kv-at: the context (capacity) of the store; 0: each length itself")
      ->capture_default_str();
  cmd->add_flag("--kv-scatter", o->kv_scatter,
                "interleave the measured sequence's pages with another's, so that no two of its "
                "pages are adjacent (the worst layout for reading through page tables)");
  cmd->add_option("--kv-page", o->kv_page,
                  "rows of a page of flat KV storage; 0: one page per sequence (contiguous)")
      ->capture_default_str();
  return [o]() -> int {
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph bench: %s\n", m.c_str()), 1;
    };
    auto prompts = parse_ints(o->prompts), gens = parse_ints(o->gens),
         depths = parse_ints(o->depths), kv_at = parse_ints(o->kv_at),
         verify = parse_ints(o->verify);
    for (auto *r : {&prompts, &gens, &depths, &kv_at, &verify})
      if (!r->ok()) return fail(r->message());
    if (o->reps < 1 || o->threads < 1 || o->batch < 1)
      return fail("-r, -t and -b must be at least 1");
    if (o->kv_page < 0 || o->kv_ctx < 0) return fail("--kv-page and --kv-ctx must not be negative");
    if (o->kv_ctx > 0 && kv_at->empty())
      return fail("--kv-ctx is the context of --kv-at; give both");
    if (o->kv_scatter && !kv_at->empty())
      return fail("--kv-scatter lays out the pages of a timed run; --kv-at times nothing");
    // Pages of kv_page rows, or one page holding the whole capacity.
    auto policy = [&](int32_t capacity) {
      return cache::Policy{capacity, std::min(o->batch, capacity),
                           o->kv_page > 0 ? o->kv_page : capacity};
    };
    auto ctk = kv::parse_storage_type(o->ctk), ctv = kv::parse_storage_type(o->ctv);
    if (!ctk.ok() || !ctv.ok()) return fail((ctk.ok() ? ctv : ctk).message());
    auto kernel = kv::parse_attention_kernel(o->attention);
    if (!kernel.ok()) return fail(kernel.message());
    // Paced: all work (loading, filling, warmup, reps) runs between a line read from stdin and
    // the next '#wait', so a harness can run two engines in turn, one rep each, never at once.
    auto pace = [&]() -> bool {
      if (!o->paced) return true;
      std::puts("#wait");
      std::fflush(stdout);
      char line[64];
      return std::fgets(line, sizeof line, stdin) != nullptr;
    };
    if (!pace()) return 0;
    auto m = load_placed(o->model, o->devices);
    if (!m.ok()) return fail(m.message());
    if (o->profile_ops && (*m)->devices().size() > 1)
      return fail("--profile-ops times nodes on the CPU alone; with GPUs or --rpc, give "
                  "--device none and no --rpc");
    report_placement(**m);
    const model::Model &model = **m;
    const model::ModelConfig &c = model.config();
    const std::string wtype = ggml_type_name(model.weights().layers.at(0).ffn_up.w->type);
    const std::string head = "{\"engine\":\"offgraph\",\"model\":\"" + json_escape(o->model) +
                             "\",\"type\":\"" + wtype +
                             "\",\"n_params\":" + std::to_string(model.n_params()) +
                             ",\"threads\":" + std::to_string(o->threads) + ",\"ctk\":\"" + o->ctk +
                             "\",\"ctv\":\"" + o->ctv + "\"";

    if (!kv_at->empty()) {
      for (int32_t len : *kv_at) {
        if (len < 1) return fail("--kv-at lengths must be positive");
        if (o->kv_ctx > 0 && len > o->kv_ctx)
          return fail("--kv-at length " + std::to_string(len) + " exceeds --kv-ctx " +
                      std::to_string(o->kv_ctx));
        auto layout = model::make_layout(model, policy(o->kv_ctx > 0 ? o->kv_ctx : len));
        if (!layout.ok()) return fail(layout.message());
        auto store = kv::KvStore::create(*layout, {*ctk, *ctv}, model.cache_buffer_types());
        if (!store.ok()) return fail(store.message());
        const kv::SeqId seq = *(*store)->create_sequence();
        if (Status st = (*store)->reserve(seq, len); !st.ok()) return fail(st.message());
        // The accounting at length `len`: the pages that hold it and the rings; the minimum at
        // that length.
        const kv::MemoryUse mu = (*store)->memory(seq);
        const auto &lay = (*store)->layout();
        int64_t minimum = 0;
        for (cache::CacheId id = 0; id < lay.n_caches(); ++id)
          minimum += lay.min_rows(id, len) * int64_t(kv::k_row_bytes(lay, id, {*ctk, *ctv}) +
                                                     kv::v_row_bytes(lay, id, {*ctk, *ctv}));
        std::printf("%s,\"test\":\"kv\",\"context\":%d,\"kv_ctx\":%d,\"kv_page\":%d,"
                    "\"kv_held\":%lld,\"kv_min\":%lld,"
                    "\"kv_buffers\":%lld,\"kv_ring\":%lld,\"kv_flat\":%lld,\"peak_rss\":%lld}\n",
                    head.c_str(), len, lay.capacity(), lay.page_rows(), (long long)mu.held,
                    (long long)minimum, (long long)mu.buffers, (long long)mu.ring,
                    (long long)mu.flat, (long long)peak_rss_bytes());
        std::fflush(stdout);
      }
      return 0;
    }

    std::mt19937 rng(uint32_t(o->seed));
    auto random_tokens = [&](int32_t n) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto &x : t) x = std::uniform_int_distribution<int32_t>(0, c.n_vocab - 1)(rng);
      return t;
    };
    using clock = std::chrono::steady_clock;
    for (int32_t d : *depths) {
      if (d < 0) return fail("depths must be >= 0");
      // One store and sequence per depth, sized for its longest test (llama-bench sizes each
      // context as depth + prompt + gen).
      int32_t longest = 1;
      for (int32_t p : *prompts) longest = std::max(longest, p);
      for (int32_t n : *gens) longest = std::max(longest, n);
      const int32_t capacity = d + longest;
      auto layout = model::make_layout(model, policy(capacity));
      if (!layout.ok()) return fail(layout.message());
      auto store = kv::KvStore::create(*layout, {*ctk, *ctv}, model.cache_buffer_types());
      if (!store.ok()) return fail(store.message());
      kv::KvStore &kv = **store;
      kv.set_attention_kernel(*kernel);
      const kv::SeqId seq = *kv.create_sequence();
      model::Forward fwd(model, kv, o->threads);
      model::NodeProfile *profile = nullptr; // set during timed reps with --profile-ops
      int32_t profiled_steps = 0;
      if (o->profile_ops)
        fwd.set_node_observer([&](const ggml_tensor *node, double seconds) {
          if (profile) profile->add(node, seconds);
        });
      // Computes `tokens` at the sequence's end in max_write chunks, logits of the last row.
      auto prefill = [&](const std::vector<int32_t> &tokens) -> Status {
        for (size_t at = 0; at < tokens.size();) {
          const int32_t n = int32_t(std::min<size_t>(size_t(o->batch), tokens.size() - at));
          model::Batch b;
          b.tokens.assign(tokens.begin() + long(at), tokens.begin() + long(at) + n);
          b.spans.push_back({seq, kv.sequence(seq)->length(), n});
          b.logit_rows = {n - 1};
          auto logits = fwd.run(b);
          if (!logits.ok()) return logits.status();
          profiled_steps += profile != nullptr;
          at += size_t(n);
        }
        return ok_status();
      };
      auto decode = [&](int32_t n) -> Status {
        int32_t token = random_tokens(1)[0];
        for (int32_t i = 0; i < n; ++i) {
          model::Batch b;
          b.tokens = {token};
          b.spans.push_back({seq, kv.sequence(seq)->length(), 1});
          b.logit_rows = {0};
          auto logits = fwd.run(b);
          if (!logits.ok()) return logits.status();
          profiled_steps += profile != nullptr;
          token = int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin());
        }
        return ok_status();
      };
      if (o->kv_scatter) { // pages taken in turn by seq and a bystander: seq gets every other one
        const kv::SeqId other = *kv.create_sequence();
        for (int32_t end = kv.page_rows(); end < capacity + kv.page_rows(); end += kv.page_rows())
          for (kv::SeqId s : {seq, other})
            if (Status st = kv.reserve(s, std::min(end, capacity)); !st.ok())
              return fail(st.message());
      }
      if (Status st = kv.reserve(seq, capacity); !st.ok()) return fail(st.message());
      if (!o->no_warmup) {
        const int32_t wp = prompts->empty() ? 0 : std::min((*prompts)[0], capacity - 1);
        if (wp > 0)
          if (Status st = prefill(random_tokens(wp)); !st.ok()) return fail(st.message());
        if (Status st = decode(1); !st.ok()) return fail(st.message());
        kv.sequence(seq)->clear();
      }
      const auto fill_start = clock::now();
      if (d > 0)
        if (Status st = prefill(random_tokens(d)); !st.ok()) return fail(st.message());
      const double fill_s = std::chrono::duration<double>(clock::now() - fill_start).count();
      auto snap = kv.snapshot(seq);
      if (!snap.ok()) return fail(snap.message());
      std::fprintf(stderr, "offgraph bench: depth %d filled in %.1f s\n", d, fill_s);
      struct Test {
        const char *name;
        int32_t n;
      };
      if (!verify->empty()) {
        if (Status st =
                verify_steps(fwd, kv, seq, **snap, *verify, o->reps, d, head, random_tokens);
            !st.ok())
          return fail(st.message());
        continue;
      }
      std::vector<Test> tests;
      for (int32_t p : *prompts)
        if (p > 0) tests.push_back({"pp", p});
      for (int32_t n : *gens)
        if (n > 0) tests.push_back({"tg", n});
      for (const Test &t : tests) {
        std::vector<double> ts;
        model::NodeProfile test_profile;
        profiled_steps = 0;
        // Bytes to and from every RPC device during the timed reps (restores included: a
        // snapshot's rows are copied on the device, not over the wire).
        const model::Devices &devs = model.devices();
        auto wire = [&] {
          int64_t to = 0, from = 0;
          for (int32_t i = 0; i < devs.size(); ++i)
            to += devs.bytes_to(i), from += devs.bytes_from(i);
          return std::pair{to, from};
        };
        const auto wire0 = wire();
        int32_t rpc_devices = 0; // servers only: local GPUs are devices too
        for (int32_t i = 0; i < devs.size(); ++i) rpc_devices += !devs.endpoint(i).empty();
        fwd.reset_phase_times();
        for (int32_t r = 0; r < o->reps; ++r) {
          if (!pace()) return 0;
          if (Status st = kv.restore(seq, **snap); !st.ok()) return fail(st.message());
          const auto start = clock::now();
          profile = o->profile_ops ? &test_profile : nullptr;
          Status st = t.name[0] == 'p' ? prefill(random_tokens(t.n)) : decode(t.n);
          profile = nullptr;
          const double s = std::chrono::duration<double>(clock::now() - start).count();
          if (!st.ok()) return fail(st.message());
          ts.push_back(double(t.n) / s);
          std::fprintf(stderr, "offgraph bench: %s%d @ d%d rep %d/%d: %.2f t/s\n", t.name, t.n, d,
                       r + 1, o->reps, ts.back());
          if (o->paced) std::printf("#sample %s %.3f\n", t.name, ts.back());
        }
        if (const auto &ph = fwd.phase_times(); ph.steps > 0) {
          const double k = 1e3 / double(ph.steps);
          std::fprintf(stderr,
                       "offgraph bench: %s%d @ d%d per step (ms): build %.3f, allocate %.3f, "
                       "inputs %.3f, compute %.3f, outputs %.3f\n",
                       t.name, t.n, d, ph.build * k, ph.allocate * k, ph.inputs * k, ph.compute * k,
                       ph.outputs * k);
        }
        if (!test_profile.empty())
          test_profile.print(
              stderr,
              (std::string("offgraph ") + t.name + std::to_string(t.n) + " @ d" + std::to_string(d))
                  .c_str(),
              profiled_steps);
        const kv::MemoryUse mu = kv.memory(seq);
        const auto wire1 = wire();
        const double tokens_run = double(t.n) * double(o->reps);
        std::string list;
        double sum = 0;
        for (double x : ts) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%s%.3f", list.empty() ? "" : ",", x);
          list += buf;
          sum += x;
        }
        std::printf("%s,\"test\":\"%s\",\"n\":%d,\"depth\":%d,\"batch\":%d,\"ts\":[%s],"
                    "\"avg_ts\":%.3f,\"depth_fill_s\":%.3f,\"kv_held\":%lld,\"kv_min\":%lld,"
                    "\"kv_buffers\":%lld,\"peak_rss\":%lld,\"rpc_devices\":%d,"
                    "\"rpc_bytes_sent_per_token\":%.1f,\"rpc_bytes_received_per_token\":%.1f}\n",
                    head.c_str(), t.name, t.n, d, o->batch, list.c_str(), sum / double(ts.size()),
                    fill_s, (long long)mu.held, (long long)mu.minimum, (long long)mu.buffers,
                    (long long)peak_rss_bytes(), rpc_devices,
                    double(wire1.first - wire0.first) / tokens_run,
                    double(wire1.second - wire0.second) / tokens_run);
        std::fflush(stdout);
      }
    }
    return 0;
  };
}

} // namespace offgraph::cli
