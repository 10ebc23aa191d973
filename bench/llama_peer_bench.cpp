// llama_peer_bench: prefill and decode tokens/s of the pinned llama.cpp (libllama from
// scripts/peer.sh), measured as llama-bench measures them, but with the CPU's extra buffer types
// off (model params use_extra_bufts = false). The pinned llama-bench cannot turn them off (its
// `-ot .*=CPU` still picks the extra types), and on this CPU the AMX repack path they enable
// crashes on Q8_0 and Q4_K files (docs/peer.md). bench/run checks this program against
// llama-bench itself on F16 files, where the AMX path is not used.
//
// For each test (pp: p prompt tokens; tg: n single-token decode steps) a context of depth + p (or
// depth + n) cells is made (n_batch 2048, n_ubatch 512, f16 K/V, flash attention auto: the
// llama-bench defaults); a warmup runs one prompt (pp) or one decode step (tg); each rep clears
// the memory, brings back the depth (computed once in n_batch chunks, then restored from the
// saved sequence state) and times the test. One JSON object per test, with llama-bench's field
// names: n_prompt, n_gen, n_depth, samples_ts, avg_ts.
#include "llama.h"
#include "model/node_profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string model;
  int p = 512, n = 128, depth = 0, reps = 5, threads = 2;
  bool paced = false; // as `offgraph bench --paced`: '#wait' + a line from stdin before each unit
  bool profile_ops = false; // as `offgraph bench --profile-ops`, through the eval callback
};

// --profile-ops: the scheduler computes up to each node the callback asks for and synchronizes,
// so asking for every node times them one by one (the callback's first call starts the clock).
struct OpTimer {
  offgraph::model::NodeProfile *profile = nullptr; // set during timed reps
  std::chrono::steady_clock::time_point start;
};

bool time_node(ggml_tensor *t, bool ask, void *user) {
  auto *timer = static_cast<OpTimer *>(user);
  const auto now = std::chrono::steady_clock::now();
  if (ask) {
    timer->start = now;
    return true;
  }
  if (timer->profile)
    timer->profile->add(t, std::chrono::duration<double>(now - timer->start).count());
  return true;
}

// Paced: every piece of work runs between a line read from stdin and the next '#wait'.
bool pace(const Args &a) {
  if (!a.paced) return true;
  std::puts("#wait");
  std::fflush(stdout);
  char line[64];
  return std::fgets(line, sizeof line, stdin) != nullptr;
}

std::mt19937 rng(1);

int random_token(int n_vocab) { return std::uniform_int_distribution<int>(0, n_vocab - 1)(rng); }

bool decode_tokens(llama_context *ctx, int count, int n_batch, int n_vocab, bool bos) {
  std::vector<llama_token> tokens(static_cast<size_t>(n_batch));
  for (int done = 0; done < count;) {
    const int k = std::min(n_batch, count - done);
    for (int i = 0; i < k; ++i) tokens[size_t(i)] = random_token(n_vocab);
    if (done == 0 && bos) tokens[0] = llama_vocab_bos(llama_model_get_vocab(llama_get_model(ctx)));
    // llama_batch_get_one: positions continue the sequence; only the last row's logits.
    if (llama_decode(ctx, llama_batch_get_one(tokens.data(), k)) != 0) return false;
    done += k;
  }
  llama_synchronize(ctx);
  return true;
}

bool generate(llama_context *ctx, int count, int n_vocab) {
  llama_token t = random_token(n_vocab);
  for (int i = 0; i < count; ++i) {
    if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) return false;
    llama_synchronize(ctx);
    t = random_token(n_vocab);
  }
  return true;
}

} // namespace

int main(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    if (std::string(argv[i]) == "--paced" || std::string(argv[i]) == "--profile-ops") {
      (std::string(argv[i]) == "--paced" ? a.paced : a.profile_ops) = true;
      --i;
      continue;
    }
    if (i + 1 >= argc)
      return std::fprintf(stderr, "llama_peer_bench: %s needs a value\n", argv[i]), 2;
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "-m")
      a.model = v;
    else if (k == "-p")
      a.p = std::atoi(v.c_str());
    else if (k == "-n")
      a.n = std::atoi(v.c_str());
    else if (k == "-d")
      a.depth = std::atoi(v.c_str());
    else if (k == "-r")
      a.reps = std::atoi(v.c_str());
    else if (k == "-t")
      a.threads = std::atoi(v.c_str());
    else
      return std::fprintf(stderr, "llama_peer_bench: unknown option %s\n", k.c_str()), 2;
  }
  if (a.model.empty() || a.reps < 1)
    return std::fprintf(stderr,
                        "usage: llama_peer_bench -m FILE [-p N -n N -d N -r N -t N] [--paced]\n"),
           2;
  if (!pace(a)) return 0;
  llama_log_set(
      [](ggml_log_level level, const char *text, void *) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.use_extra_bufts = false;
  llama_model *model = llama_model_load_from_file(a.model.c_str(), mp);
  if (!model) return std::fprintf(stderr, "llama_peer_bench: cannot load %s\n", a.model.c_str()), 1;
  const llama_vocab *vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const bool bos = llama_vocab_get_add_bos(vocab);
  std::vector<uint8_t> depth_state;
  for (int test = 0; test < 2; ++test) {
    const int count = test == 0 ? a.p : a.n;
    if (count <= 0) continue;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(a.depth + count);
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_threads = a.threads;
    cp.n_threads_batch = a.threads;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    OpTimer timer;
    offgraph::model::NodeProfile profile;
    if (a.profile_ops) {
      cp.cb_eval = time_node;
      cp.cb_eval_user_data = &timer;
    }
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return std::fprintf(stderr, "llama_peer_bench: cannot create a context\n"), 1;
    llama_memory_t mem = llama_get_memory(ctx);
    llama_memory_clear(mem, false);
    const bool warm =
        test == 0 ? decode_tokens(ctx, count, 2048, n_vocab, bos) : generate(ctx, 1, n_vocab);
    if (!warm) return std::fprintf(stderr, "llama_peer_bench: warmup failed\n"), 1;
    std::vector<double> ts;
    for (int r = 0; r < a.reps; ++r) {
      if (!pace(a)) return 0;
      llama_memory_clear(mem, false);
      if (a.depth > 0) {
        bool restored = false;
        if (!depth_state.empty())
          restored = llama_state_seq_set_data(ctx, depth_state.data(), depth_state.size(), 0) != 0;
        if (!restored) {
          llama_memory_clear(mem, false);
          const auto f0 = std::chrono::steady_clock::now();
          if (!decode_tokens(ctx, a.depth, 2048, n_vocab, bos))
            return std::fprintf(stderr, "llama_peer_bench: depth fill failed\n"), 1;
          std::fprintf(
              stderr, "llama_peer_bench: depth %d filled in %.1f s\n", a.depth,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count());
          depth_state.resize(llama_state_seq_get_size(ctx, 0));
          llama_state_seq_get_data(ctx, depth_state.data(), depth_state.size(), 0);
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (a.profile_ops) timer.profile = &profile;
      const bool ok = test == 0 ? decode_tokens(ctx, count, 2048, n_vocab, false)
                                : generate(ctx, count, n_vocab);
      timer.profile = nullptr;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!ok) return std::fprintf(stderr, "llama_peer_bench: decode failed\n"), 1;
      ts.push_back(count / s);
      std::fprintf(stderr, "llama_peer_bench: %s%d @ d%d rep %d/%d: %.2f t/s\n",
                   test == 0 ? "pp" : "tg", count, a.depth, r + 1, a.reps, ts.back());
      if (a.paced) std::printf("#sample %s %.3f\n", test == 0 ? "pp" : "tg", ts.back());
    }
    if (!profile.empty()) {
      // Steps: one per 512-token ubatch of the prompt, one per generated token.
      const int steps = a.reps * (test == 0 ? (count + 511) / 512 : count);
      const std::string title = std::string("llama.cpp ") + (test == 0 ? "pp" : "tg") +
                                std::to_string(count) + " @ d" + std::to_string(a.depth);
      profile.print(stderr, title.c_str(), steps);
    }
    std::string list;
    double sum = 0;
    for (double x : ts) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.3f", list.empty() ? "" : ", ", x);
      list += buf;
      sum += x;
    }
    std::printf("{\"n_prompt\": %d, \"n_gen\": %d, \"n_depth\": %d, \"n_threads\": %d, "
                "\"samples_ts\": [%s], \"avg_ts\": %.3f}\n",
                test == 0 ? count : 0, test == 0 ? 0 : count, a.depth, a.threads, list.c_str(),
                sum / double(ts.size()));
    std::fflush(stdout);
    llama_free(ctx);
  }
  llama_model_free(model);
  return 0;
}
