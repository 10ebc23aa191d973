#include "synth/synth.h"
#include "synth/tensor_plan.h"

#include "model/arch.h"
#include "model/config.h"
#include "model/gguf_file.h"
#include "model/weights.h"

#include "ggml-cpp.h"
#include "gguf.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <unistd.h>

namespace offgraph::synth {

std::vector<std::string> preset_names() { return {"tiny", "small", "0.4b", "1b", "30b"}; }

namespace {

// Gemma 4's released shapes at test widths: E2B (35 layers, every 5th global, the last 20 reading
// donors 13 and 14, one KV head, per-layer embeddings), E4B (42 layers, every 6th global, the
// last 18 shared, two KV heads), 31B (every 6th global, no sharing, fewer KV heads on global
// layers, whose V is K). Layer counts are cut so the donors keep their kinds.
Result<SynthSpec> gemma4_preset(const std::string &name) {
  SynthSpec s;
  s.arch = "gemma4";
  s.name = "offgraph-synth-gemma4-" + name;
  s.n_embd = 64, s.n_head = 4, s.head_dim = 64, s.head_dim_swa = 32, s.n_ff = 128, s.window = 16;
  if (name == "e2b" || name == "tiny") {
    s.double_wide_shared = true;
    s.n_layer = 10, s.pattern_period = 5, s.n_kv_shared = 5, s.n_head_kv = 1,
    s.n_embd_per_layer = 16;
  } else if (name == "e4b") {
    s.n_layer = 12, s.pattern_period = 6, s.n_kv_shared = 6, s.n_head_kv = 2,
    s.n_embd_per_layer = 16;
  } else if (name == "31b") {
    s.n_layer = 12, s.pattern_period = 6, s.n_head_kv = 1, s.n_head_kv_swa = 2, s.global_v = false,
    s.own_head = true;
  } else if (name == "e2b-bench") {
    // E2B's proportions at a width two cores benchmark in minutes: 15 layers, every 5th global,
    // the last 10 reading donors 3 (sliding) and 4 (global) as E2B's last 20 read 13 and 14; one
    // KV head of 512 (global) or 256 (sliding) for 8 query heads; window 512; double-wide shared
    // FFNs; the per-layer embeddings cut to 64 wide (a 262K-row table per layer is size, not work).
    s.n_layer = 15, s.pattern_period = 5, s.n_kv_shared = 10, s.n_embd = 1024, s.n_head = 8,
    s.n_head_kv = 1, s.head_dim = 512, s.head_dim_swa = 256, s.n_ff = 4096, s.window = 512,
    s.n_embd_per_layer = 64, s.double_wide_shared = true, s.weight_type = GGML_TYPE_Q8_0;
  } else if (name == "31b-bench") {
    // 31B's proportions at a benchmark width: 12 layers, every 6th global, 8 query heads to 4 KV
    // heads of 256 on sliding layers and 1 of 512 on global ones (whose V is K), window 1024.
    s.n_layer = 12, s.pattern_period = 6, s.n_embd = 1024, s.n_head = 8, s.n_head_kv = 1,
    s.n_head_kv_swa = 4, s.head_dim = 512, s.head_dim_swa = 256, s.n_ff = 4096, s.window = 1024,
    s.global_v = false, s.weight_type = GGML_TYPE_Q8_0;
  } else {
    return Status::error("synth: unknown gemma4 preset '" + name +
                         "' (e2b, e4b, 31b, e2b-bench, 31b-bench)");
  }
  return s;
}

} // namespace

Result<SynthSpec> preset(const std::string &name, const std::string &arch) {
  if (arch == "gemma4") return gemma4_preset(name);
  if (arch != "muse-glimmer" && arch != "llama")
    return Status::error("synth: architecture '" + arch +
                         "' is not supported (muse-glimmer, llama, gemma4)");
  SynthSpec s;
  s.arch = arch;
  s.name = "offgraph-synth-" + arch + "-" + name;
  if (name == "tiny") {
    // the defaults
  } else if (name == "small") {
    s.n_layer = 8, s.n_embd = 256, s.n_head = 8, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 768,
    s.window = 64, s.weight_type = GGML_TYPE_Q8_0;
  } else if (name == "0.4b") {
    s.n_layer = 8, s.n_embd = 1024, s.n_head = 8, s.n_head_kv = 4, s.head_dim = 128, s.n_ff = 4096,
    s.window = 256, s.weight_type = GGML_TYPE_F16;
  } else if (name == "1b") {
    s.n_layer = 12, s.n_embd = 2048, s.n_head = 16, s.n_head_kv = 2, s.head_dim = 128,
    s.n_ff = 6144, s.window = 512, s.weight_type = GGML_TYPE_Q8_0;
  } else if (name == "30b") {
    s.n_layer = 52, s.n_embd = 6656, s.n_head = 32, s.n_head_kv = 2, s.head_dim = 128,
    s.n_ff = 19968;
    s.window = 2048, s.n_ctx = 131072, s.n_vocab = 202048, s.metadata_only = true,
    s.pattern_array = true;
    s.weight_type = GGML_TYPE_Q4_K;
  } else {
    std::string all;
    for (const auto &p : preset_names()) all += (all.empty() ? "" : ", ") + p;
    return Status::error("synth: unknown preset '" + name + "' (presets: " + all + ")");
  }
  return s;
}

namespace {

Status read_file(const std::string &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("synth: cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return ok_status();
}

} // namespace

// Layer i's FFN width: twice the width on the shared layers of a double-wide file (E2B's
// use_double_wide_mlp, which the converter writes as a per-layer feed_forward_length).
int64_t ffn_width(const SynthSpec &s, int32_t i) {
  return s.double_wide_shared && i >= s.n_layer - s.n_kv_shared ? 2 * int64_t(s.n_ff) : s.n_ff;
}

// Which optional tensors (bind_weights asks; the others are required) the file holds: a head of
// its own (llama's is optional and always written; gemma4's when own_head), and for gemma4 each
// layer's output scale and the V projection of a layer that keeps KV (sliding, or global with
// global_v). Never the fused attn_qkv, biases, scales, or a shared layer's K/V.
bool writes_optional(const SynthSpec &s, const std::string &name) {
  if (name == "output.weight") return s.arch != "gemma4" || s.own_head;
  if (s.arch != "gemma4") return false;
  int layer = -1, end = 0;
  if (std::sscanf(name.c_str(), "blk.%d.%n", &layer, &end) != 1 || end == 0) return false;
  const std::string base = name.substr(size_t(end));
  if (base == "layer_output_scale.weight") return true;
  const bool slides = layer % s.pattern_period < s.pattern_period - 1;
  return base == "attn_v.weight" && layer < s.n_layer - s.n_kv_shared && (slides || s.global_v);
}

// How a tensor's values are drawn, at scales that keep activations near unit size: matrices
// N(0, 1/in); gains 1 + N(0, 0.1). Residual branches start small (as GPT-2 initialises them,
// 1/sqrt(2 x layers): muse-glimmer's and llama's output projections, every post-norm), since
// random deep nets are otherwise chaotic and rounding differences of 1e-4 grow into different
// tokens; a head of its own 4x the unit scale spreads the logits so greedy choices are decisive.
// gemma4 scales its embedding by sqrt(E) in the graph, so its rows start at 1/sqrt(E); its
// rope_freqs rotate a quarter of the global dims (1e30 freezes the rest), as released.
TensorPlan value_plan(const SynthSpec &s, const model::TensorRequest &r) {
  const bool gemma4 = s.arch == "gemma4", muse = s.arch == "muse-glimmer";
  const std::string base =
      r.name.rfind("blk.", 0) == 0 ? r.name.substr(r.name.find('.', 4) + 1) : r.name;
  const float branch = float(1.0 / std::sqrt(2.0 * s.n_layer));
  const ggml_type wt = s.weight_type;
  switch (r.role) {
  case model::Role::Vector: {
    const int64_t n = r.shape.at(0);
    if (base == "rope_freqs.weight") {
      TensorPlan freqs = vector_plan(r.name, n, TensorPlan::Constant, 1.0f);
      freqs.values.assign(size_t(n), 1e30f);
      for (int64_t j = 0; j < n / 4; ++j) freqs.values[size_t(j)] = 1.0f;
      return freqs;
    }
    if (base == "post_attention_norm.weight" || base == "post_ffw_norm.weight" ||
        base == "post_norm.weight")
      return vector_plan(r.name, n, TensorPlan::Constant, branch);
    if (muse && base == "attn_q_norm.weight")
      return vector_plan(r.name, n, TensorPlan::Constant, 3.87f);
    if (muse && base == "attn_k_norm.weight")
      return vector_plan(r.name, n, TensorPlan::Constant, 1.0f);
    return vector_plan(r.name, n, TensorPlan::Gain, 0.1f);
  }
  case model::Role::Embedding: {
    const int64_t in = r.shape.at(0);
    const float scale = base == "per_layer_token_embd.weight"
                            ? float(1.0 / std::sqrt(double(s.n_embd_per_layer)))
                        : gemma4 ? float(1.0 / std::sqrt(double(in)))
                                 : 1.0f;
    return matrix_plan(r.name, in, r.shape.at(1), fit(wt, in), TensorPlan::Normal, scale);
  }
  case model::Role::Matrix:
  default: {
    const int64_t in = r.shape.at(0);
    float scale = float(1.0 / std::sqrt(double(in)));
    if (base == "output.weight") scale *= 4.0f;
    if (!gemma4 && (base == "attn_output.weight" || base == "ffn_down.weight")) scale *= branch;
    return matrix_plan(r.name, in, r.shape.at(1), fit(wt, in), TensorPlan::Normal, scale);
  }
  }
}

// The file's tensors as the architecture's loader binds them: the keys (with token_embd, which
// sizes the vocabulary) go to a metadata-only file that model::read_config reads, and
// bind_weights runs on a planning binder, so an architecture's tensors are listed in one place
// (model_tests loads every preset with the real binder, in this order).
Status plan_tensors(const SynthSpec &s, gguf_context *keys, const TensorPlan &embedding,
                    std::vector<TensorPlan> &plan) {
  // A name of its own beside no one's file; removed on every way out.
  static std::atomic<uint64_t> probes{0};
  const std::string probe =
      (std::filesystem::temp_directory_path() /
       ("offgraph-synth-keys-" + std::to_string(::getpid()) + "-" + std::to_string(probes++)))
          .string();
  struct Remove {
    const std::string &path;
    ~Remove() { std::remove(path.c_str()); }
  } remove_probe{probe};
  {
    gguf_context_ptr copy(gguf_init_empty());
    gguf_set_kv(copy.get(), keys);
    uint64_t n_params = 0, bytes = 0;
    OFFGRAPH_TRY(write_gguf(copy.get(), {embedding}, probe, true, 0, nullptr, n_params, bytes));
  }
  auto file = model::GgufFile::open(probe);
  if (!file.ok()) return file.status();
  auto config = model::read_config(**file);
  if (!config.ok()) return Status::error("synth: the keys written: " + config.message());
  const model::Architecture *arch = model::find_architecture(config->arch_name);
  if (!arch) return Status::error("synth: no loader for '" + config->arch_name + "'");
  model::TensorBinder planner([&](const std::string &name) { return writes_optional(s, name); });
  model::Weights weights;
  OFFGRAPH_TRY(arch->bind_weights(planner, *config, weights));
  for (const model::TensorRequest &r : planner.requests()) plan.push_back(value_plan(s, r));
  return ok_status();
}

Result<std::string> write_model(const SynthSpec &s, const std::string &path,
                                const std::function<void(uint64_t, uint64_t)> &progress) {
  const bool muse = s.arch == "muse-glimmer", gemma4 = s.arch == "gemma4";
  if (!muse && !gemma4 && s.arch != "llama")
    return Status::error("synth: unknown architecture '" + s.arch + "'");
  if (s.n_layer < 1 || s.n_embd < 1 || s.n_head < 1 || s.n_head_kv < 1 || s.head_dim < 2 ||
      s.n_ff < 1 || s.n_head % s.n_head_kv != 0 || ((muse || gemma4) && s.window < 1) ||
      (s.n_head_kv_swa > 0 && s.n_head % s.n_head_kv_swa != 0) || s.n_kv_shared < 0 ||
      s.n_kv_shared >= s.n_layer)
    return Status::error("synth: inconsistent sizes (layers, embd, heads multiple of KV heads, "
                         "head dim >= 2, ff, window >= 1)");
  gguf_context_ptr out(gguf_init_empty());
  int64_t n_vocab = s.n_vocab;
  if (!s.vocab_path.empty()) {
    gguf_init_params vp = {true, nullptr};
    gguf_context_ptr vocab(gguf_init_from_file(s.vocab_path.c_str(), vp));
    if (!vocab)
      return Status::error("synth: '" + s.vocab_path + "' is not a readable GGUF vocabulary");
    const int64_t tokens = gguf_find_key(vocab.get(), "tokenizer.ggml.tokens");
    if (tokens < 0)
      return Status::error("synth: '" + s.vocab_path + "' has no tokenizer.ggml.tokens");
    n_vocab = int64_t(gguf_get_arr_n(vocab.get(), tokens));
    gguf_set_kv(out.get(), vocab.get());
    // Keep only the tokenizer's keys; the rest describe the vocabulary file's own model.
    for (int64_t i = gguf_get_n_kv(out.get()) - 1; i >= 0; --i) {
      const std::string key = gguf_get_key(out.get(), i);
      if (key.rfind("tokenizer.", 0) != 0) gguf_remove_key(out.get(), key.c_str());
    }
  }
  if (n_vocab < 1)
    return Status::error("synth: no vocabulary (give a vocab GGUF or a vocabulary size)");
  // No vocabulary: llama.cpp's name for that, so that libllama loads the file (tokens only).
  if (s.vocab_path.empty()) gguf_set_val_str(out.get(), "tokenizer.ggml.model", "none");
  if (!s.template_path.empty()) {
    std::string tmpl;
    if (Status st = read_file(s.template_path, tmpl); !st.ok()) return st;
    gguf_set_val_str(out.get(), "tokenizer.chat_template", tmpl.c_str());
  }

  const std::string p = s.arch + ".";
  auto u32 = [&](const std::string &k, int64_t v) {
    gguf_set_val_u32(out.get(), (p + k).c_str(), uint32_t(v));
  };
  gguf_set_val_str(out.get(), "general.architecture", s.arch.c_str());
  gguf_set_val_str(out.get(), "general.name", s.name.c_str());
  gguf_set_val_u32(out.get(), "general.file_type", s.weight_type == GGML_TYPE_F32 ? 0 : 1);
  u32("context_length", s.n_ctx);
  u32("embedding_length", s.n_embd);
  if (s.double_wide_shared) {
    std::vector<uint32_t> ff(size_t(s.n_layer));
    for (int32_t i = 0; i < s.n_layer; ++i) ff[size_t(i)] = uint32_t(ffn_width(s, i));
    gguf_set_arr_data(out.get(), (p + "feed_forward_length").c_str(), GGUF_TYPE_UINT32, ff.data(),
                      ff.size());
  } else {
    u32("feed_forward_length", s.n_ff);
  }
  u32("block_count", s.n_layer);
  u32("attention.head_count", s.n_head);
  auto slides = [&](int32_t i) { return i % s.pattern_period < s.pattern_period - 1; };
  const int32_t head_dim_swa = s.head_dim_swa > 0 ? s.head_dim_swa : s.head_dim;
  const int32_t kv_swa = s.n_head_kv_swa > 0 ? s.n_head_kv_swa : s.n_head_kv;
  if (gemma4) { // per-layer KV heads, per-kind head sizes and rotation
    std::vector<uint32_t> kv(size_t(s.n_layer));
    for (int32_t i = 0; i < s.n_layer; ++i)
      kv[size_t(i)] = uint32_t(slides(i) ? kv_swa : s.n_head_kv);
    gguf_set_arr_data(out.get(), (p + "attention.head_count_kv").c_str(), GGUF_TYPE_UINT32,
                      kv.data(), kv.size());
    u32("attention.key_length_swa", head_dim_swa);
    u32("attention.value_length_swa", head_dim_swa);
    u32("rope.dimension_count_swa", head_dim_swa);
    u32("attention.shared_kv_layers", s.n_kv_shared);
    u32("embedding_length_per_layer_input", s.n_embd_per_layer);
    gguf_set_val_f32(out.get(), (p + "rope.freq_base_swa").c_str(), 10000.0f);
    gguf_set_val_f32(out.get(), (p + "final_logit_softcapping").c_str(), 30.0f);
  } else {
    u32("attention.head_count_kv", s.n_head_kv);
  }
  u32("attention.key_length", s.head_dim);
  u32("attention.value_length", s.head_dim);
  u32("rope.dimension_count", s.head_dim);
  u32("vocab_size", n_vocab);
  gguf_set_val_f32(out.get(), (p + "attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
  gguf_set_val_f32(out.get(), (p + "rope.freq_base").c_str(), 500000.0f);
  if (muse || gemma4) {
    u32("attention.sliding_window", s.window);
    if (s.pattern_array || gemma4) {
      std::vector<uint8_t> pattern(size_t(s.n_layer));
      for (int32_t i = 0; i < s.n_layer; ++i) pattern[size_t(i)] = gemma4 ? slides(i) : i % 4 != 3;
      gguf_set_arr_data(out.get(), (p + "attention.sliding_window_pattern").c_str(), GGUF_TYPE_BOOL,
                        pattern.data(), pattern.size());
    } else {
      u32("attention.sliding_window_pattern", s.pattern_period);
    }
  }
  if (muse) {
    gguf_set_val_f32(out.get(), (p + "final_logit_softcapping").c_str(), 20.0f);
    // The published multiplier is 1/sqrt(embd / 256).
    gguf_set_val_f32(out.get(), (p + "logit_scale").c_str(),
                     float(1.0 / std::sqrt(double(s.n_embd) / 256.0)));
  }

  const int64_t E = s.n_embd;
  std::vector<TensorPlan> plan;
  OFFGRAPH_TRY(plan_tensors(
      s, out.get(),
      matrix_plan("token_embd.weight", E, n_vocab, fit(s.weight_type, E), TensorPlan::Normal, 1.0f),
      plan));

  uint64_t n_params = 0, total = 0;
  OFFGRAPH_TRY(
      write_gguf(out.get(), plan, path, s.metadata_only, s.seed, progress, n_params, total));
  std::string summary = s.arch + ", " + std::to_string(s.n_layer) + " layers, embd " +
                        std::to_string(E) + ", " + std::to_string(n_params) +
                        " parameters, vocab " + std::to_string(n_vocab);
  if (s.metadata_only) return summary + ", metadata only";
  return summary + ", " + std::to_string(total) + " bytes of weights";
}

} // namespace offgraph::synth
