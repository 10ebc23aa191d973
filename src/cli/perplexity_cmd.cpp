// `offgraph perplexity`: the perplexity of a model over a text, scored as llama.cpp's perplexity
// tool scores it, so that the two can be compared on the same file and text. The text is
// tokenized once (BOS first when the vocabulary asks for it) and cut into consecutive windows of
// n_ctx tokens; each window starts a fresh sequence with its first token replaced by BOS, is fed
// in batches of n_batch, and only the predictions in its second half count (every scored token
// then has at least n_ctx / 2 tokens of context). The result is exp(mean NLL) and the standard
// error of that mean carried through the exponential.
#include "commands.h"
#include "device_flags.h"

#include "kv/storage_types.h"
#include "model/forward.h"
#include "text/tokenizer/tokenizer.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

namespace offgraph::cli {

std::function<int()> add_perplexity(CLI::App &app) {
  struct Opts {
    std::string model, file, ctk = "f16", ctv = "f16", ring_order = "physical";
    int32_t ctx = 512, batch = 64, threads = 2, chunks = -1;
    bool full = false;
    DeviceFlags devices;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd = app.add_subcommand(
      "perplexity", "perplexity over a text, in strided windows as llama.cpp's perplexity tool");
  cmd->add_option("-m,--model", o->model, "the GGUF model (default: the shipped model)");
  cmd->add_option("-f,--file", o->file, "the text")->required();
  add_device_flags(*cmd, o->devices);
  cmd->add_option("-c,--ctx", o->ctx, "window (context) length; the second half is scored")
      ->capture_default_str();
  cmd->add_option("-b,--batch", o->batch, "tokens per forward pass (max_write)")
      ->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "score at most this many windows (-1: all)")
      ->capture_default_str();
  cmd->add_option("--ctk", o->ctk, "K cache type (f32, f16, bf16, q8_0, q4_0, ...)")
      ->capture_default_str();
  cmd->add_option("--ctv", o->ctv, "V cache type")->capture_default_str();
  cmd->add_flag("--full-cache", o->full,
                "no rings: every layer keeps all n_ctx rows (sliding layers still mask to their "
                "window)");
  cmd->add_option("--ring-order", o->ring_order, "physical or logical (see offgraph logits)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  return [o]() -> int {
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph perplexity: %s\n", m.c_str()), 1;
    };
    if (o->model.empty()) {
      auto path = default_model();
      if (!path.ok()) return fail(path.message());
      o->model = *path;
    }
    if (o->ctx < 4 || o->batch < 1) return fail("-c must be at least 4 and -b at least 1");
    if (o->ring_order != "physical" && o->ring_order != "logical")
      return fail("--ring-order is physical or logical");
    std::ifstream in(o->file, std::ios::binary);
    if (!in) return fail("cannot read " + o->file);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();

    auto m = load_placed(o->model, o->devices, [](uint64_t d, uint64_t t) {
      if (t > (256u << 20)) progress_bar("loading", d, t);
    });
    if (!m.ok()) return fail(m.message());
    report_placement(**m);
    auto tok = text::Tokenizer::from_gguf(o->model);
    if (!tok.ok()) return fail(tok.message());
    const text::Tokenizer &t = **tok;
    const bool add_bos = t.add_bos_default() && t.bos() >= 0;
    std::vector<int32_t> tokens = t.encode(text, add_bos, false);
    const int32_t n_ctx = o->ctx;
    if (int64_t(tokens.size()) < 2 * int64_t(n_ctx))
      return fail("the text has " + std::to_string(tokens.size()) + " tokens; -c " +
                  std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
    int32_t n_chunk = int32_t(tokens.size() / size_t(n_ctx));
    if (o->chunks >= 0) n_chunk = std::min(n_chunk, o->chunks);

    auto ctk = kv::parse_storage_type(o->ctk), ctv = kv::parse_storage_type(o->ctv);
    if (!ctk.ok() || !ctv.ok()) return fail((ctk.ok() ? ctv : ctk).message());
    const int32_t n_batch = std::min(o->batch, n_ctx);
    // With max_write = n_ctx and a ring reach of n_ctx no sliding cache can be a ring
    // (window + n_ctx - 1 >= n_ctx), so every layer is stored in full, fed the same batches.
    cache::Policy policy{n_ctx, o->full ? n_ctx : n_batch};
    if (o->full) policy.ring_reach = n_ctx;
    auto layout = model::make_layout(**m, policy);
    if (!layout.ok()) return fail(layout.message());
    int n_ring = 0;
    for (int32_t i = 0; i < (*layout)->n_caches(); ++i) n_ring += (*layout)->cache(i).ring();
    auto store = kv::KvStore::create(*layout, {*ctk, *ctv}, (**m).cache_buffer_types());
    if (!store.ok()) return fail(store.message());
    if (o->ring_order == "logical")
      if (Status st = (*store)->set_ring_order(kv::RingOrder::Logical); !st.ok())
        return fail(st.message());
    model::Forward fwd(**m, **store, o->threads);
    const int32_t n_vocab = (*m)->config().n_vocab;

    std::fprintf(stderr,
                 "perplexity: %s, %zu tokens, %d windows of %d, batch %d, K %s, V %s, %d of %d "
                 "caches rings\n",
                 o->model.c_str(), tokens.size(), n_chunk, n_ctx, n_batch,
                 kv::storage_type_name(*ctk).c_str(), kv::storage_type_name(*ctv).c_str(), n_ring,
                 (*layout)->n_caches());
    const int32_t first = n_ctx / 2;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int32_t c = 0; c < n_chunk; ++c) {
      const size_t base = size_t(c) * size_t(n_ctx);
      std::vector<int32_t> window(tokens.begin() + long(base), tokens.begin() + long(base + n_ctx));
      if (add_bos) window[0] = t.bos();
      auto seq = (*store)->create_sequence();
      if (!seq.ok()) return fail(seq.message());
      for (int32_t at = 0; at < n_ctx; at += n_batch) {
        const int32_t n = std::min(n_batch, n_ctx - at);
        model::Batch b;
        b.tokens.assign(window.begin() + at, window.begin() + at + n);
        b.spans.push_back({*seq, at, n});
        // Rows whose prediction is scored: positions first .. n_ctx - 2.
        for (int32_t i = 0; i < n; ++i)
          if (at + i >= first && at + i < n_ctx - 1) b.logit_rows.push_back(i);
        auto logits = fwd.run(b);
        if (!logits.ok()) return fail(logits.message());
        for (size_t r = 0; r < b.logit_rows.size(); ++r) {
          const int32_t pos = at + b.logit_rows[r];
          if (pos < first || pos >= n_ctx - 1) continue;
          const float *row = logits->data() + r * size_t(n_vocab);
          const float max = *std::max_element(row, row + n_vocab);
          double sum = 0;
          for (int32_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v] - max));
          const double x = -(double(row[window[size_t(pos) + 1]] - max) - std::log(sum));
          nll += x;
          nll2 += x * x;
          ++count;
        }
      }
      if (Status st = (*store)->remove_sequence(*seq); !st.ok()) return fail(st.message());
      progress_bar("perplexity", uint64_t(c + 1), uint64_t(n_chunk));
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double mean = nll / double(count), ppl = std::exp(mean);
    const double var = nll2 / double(count) - mean * mean;
    const double err = var > 0 && count > 1 ? std::sqrt(var / double(count - 1)) * ppl : 0.0;
    std::printf("PPL = %.4f +/- %.5f\n", ppl, err);
    std::fprintf(stderr,
                 "perplexity: %lld tokens scored in %d windows, mean NLL %.6f, %.2f s (%.0f "
                 "tokens/s)\n",
                 (long long)count, n_chunk, mean, secs, double(n_chunk) * n_ctx / secs);
    return 0;
  };
}

} // namespace offgraph::cli
