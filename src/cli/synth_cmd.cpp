#include "commands.h"

#include "kv/storage_types.h"
#include "synth/mmproj.h"
#include "synth/synth.h"

#include <cstdio>
#include <memory>

namespace offgraph::cli {
namespace {

// A weight type by ggml's name that ggml can still write (removed types keep their names with
// a block size of 0), or GGML_TYPE_COUNT.
ggml_type type_named(const std::string &name) {
  for (int i = 0; i < GGML_TYPE_COUNT; ++i)
    if (ggml_get_type_traits(ggml_type(i))->type_name && name == ggml_type_name(ggml_type(i)) &&
        ggml_blck_size(ggml_type(i)) > 0)
      return ggml_type(i);
  return GGML_TYPE_COUNT;
}

} // namespace

std::function<int()> add_synth(CLI::App &app) {
  struct Opts {
    std::string arch = "muse-glimmer", preset = "tiny", out, type, pattern, vocab, tmpl;
    int32_t layers = 0, embd = 0, heads = 0, kv_heads = 0, head_dim = 0, ff = 0, window = 0,
            vocab_size = 0, ctx = 0;
    uint64_t seed = 1;
    bool meta_only = false, weights = false, no_vocab = false, no_template = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd = app.add_subcommand("synth", "write a GGUF model with seeded random weights");
  cmd->add_option("-o,--output", o->out, "the GGUF file to write")->required();
  cmd->add_option("--arch", o->arch, "muse-glimmer, llama or gemma4")->capture_default_str();
  cmd->add_option("--preset", o->preset,
                  "tiny, small, 0.4b, 1b or 30b; gemma4: e2b, e4b, 31b, e2b-bench or 31b-bench")
      ->capture_default_str();
  cmd->add_option("--layers", o->layers, "number of layers");
  cmd->add_option("--embd", o->embd, "embedding width");
  cmd->add_option("--heads", o->heads, "query heads");
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads");
  cmd->add_option("--head-dim", o->head_dim, "head dimension");
  cmd->add_option("--ff", o->ff, "feed-forward width");
  cmd->add_option("--window", o->window, "sliding window (muse-glimmer, gemma4)");
  cmd->add_option("--ctx", o->ctx, "training context written as context_length (tokens)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pattern", o->pattern,
                  "sliding_window_pattern as 'array' or 'scalar' (muse-glimmer)");
  cmd->add_option("--type", o->type, "weight type: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K");
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->add_option(
      "--vocab", o->vocab,
      "vocab-only GGUF to copy the tokenizer from (default: the pinned tree's llama-bpe)");
  cmd->add_flag("--no-vocab", o->no_vocab,
                "write no tokenizer (tokenizer.ggml.model 'none'; use --vocab-size)");
  cmd->add_option("--vocab-size", o->vocab_size, "vocabulary size without a tokenizer");
  cmd->add_option("--template", o->tmpl,
                  "chat template to embed (default: the pinned tree's muse-glimmer.jinja)");
  cmd->add_flag("--no-template", o->no_template, "embed no chat template");
  cmd->add_flag("--meta-only", o->meta_only, "write keys and tensor infos only, no weights");
  cmd->add_flag("--weights", o->weights,
                "write the weights even where the preset writes metadata only (30b: ~17 GB as "
                "q4_K; with --layers fewer, the same per-layer shapes; all cores)");
  return [o, cmd]() -> int {
    (void)cmd;
    auto spec = synth::preset(o->preset, o->arch);
    if (!spec.ok()) return std::fprintf(stderr, "offgraph synth: %s\n", spec.message().c_str()), 1;
    synth::SynthSpec s = *spec;
    auto set = [](int32_t v, int32_t &field) {
      if (v > 0) field = v;
    };
    set(o->layers, s.n_layer), set(o->embd, s.n_embd), set(o->heads, s.n_head),
        set(o->kv_heads, s.n_head_kv);
    set(o->head_dim, s.head_dim), set(o->ff, s.n_ff), set(o->window, s.window),
        set(o->vocab_size, s.n_vocab), set(o->ctx, s.n_ctx);
    s.seed = o->seed;
    if (o->meta_only && o->weights)
      return std::fprintf(stderr, "offgraph synth: --meta-only and --weights contradict\n"), 1;
    s.metadata_only = (s.metadata_only || o->meta_only) && !o->weights;
    if (!o->pattern.empty()) {
      if (s.arch != "muse-glimmer")
        return std::fprintf(stderr, "offgraph synth: --pattern is muse-glimmer's (%s writes %s)\n",
                            s.arch.c_str(),
                            s.arch == "gemma4" ? "a bool per layer, always" : "no pattern"),
               1;
      if (o->pattern != "array" && o->pattern != "scalar")
        return std::fprintf(stderr, "offgraph synth: --pattern must be 'array' or 'scalar'\n"), 1;
      s.pattern_array = o->pattern == "array";
    }
    if (!o->type.empty()) {
      const ggml_type t = type_named(o->type);
      if (t == GGML_TYPE_COUNT)
        return std::fprintf(stderr, "offgraph synth: unknown weight type '%s'\n", o->type.c_str()),
               1;
      s.weight_type = t;
    }
    const std::string tree = OFFGRAPH_LLAMA_TREE;
    if (!o->vocab.empty() && (o->no_vocab || o->vocab_size > 0))
      return std::fprintf(stderr, "offgraph synth: --vocab gives the tokenizer and its size; "
                                  "it cannot go with --no-vocab or --vocab-size\n"),
             1;
    // A tokenizer named by --vocab replaces a preset's bare vocabulary size (30b: 202,048).
    if (!o->vocab.empty()) s.n_vocab = 0;
    if (!o->no_vocab && s.n_vocab == 0)
      s.vocab_path = !o->vocab.empty()    ? o->vocab
                     : s.arch == "gemma4" ? tree + "/models/ggml-vocab-gemma-4.gguf"
                                          : tree + "/models/ggml-vocab-llama-bpe.gguf";
    if (!o->no_template)
      s.template_path = !o->tmpl.empty() ? o->tmpl
                        : s.arch == "gemma4"
                            ? tree + "/models/templates/google-gemma-4-31B-it.jinja"
                            : tree + "/models/templates/muse-glimmer.jinja";
    auto summary =
        synth::write_model(s, o->out, [](uint64_t d, uint64_t t) { progress_bar("synth", d, t); });
    if (!summary.ok())
      return std::fprintf(stderr, "offgraph synth: %s\n", summary.message().c_str()), 1;
    std::printf("wrote %s: %s\n", o->out.c_str(), summary->c_str());
    return 0;
  };
}

std::function<int()> add_synth_mmproj(CLI::App &app) {
  auto s = std::make_shared<synth::MmprojSpec>();
  auto out = std::make_shared<std::string>();
  auto type = std::make_shared<std::string>("f32");
  CLI::App *cmd = app.add_subcommand(
      "synth-mmproj",
      "write a Muse Glimmer vision encoder (mmproj GGUF) with seeded random weights");
  cmd->add_option("-o,--output", *out, "the GGUF file to write")->required();
  cmd->add_option("--embd-text", s->n_embd_text, "the text model's width (the projection's output)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--layers", s->n_layer, "encoder layers")->capture_default_str();
  cmd->add_option("--embd", s->n_embd, "encoder width")->capture_default_str();
  cmd->add_option("--heads", s->n_head, "attention heads")->capture_default_str();
  cmd->add_option("--ff", s->n_ff, "feed-forward width")->capture_default_str();
  cmd->add_option("--adapter", s->adapter, "adapter width")->capture_default_str();
  cmd->add_option("--pos-side", s->pos_side, "position table side (and window side), patches")
      ->capture_default_str();
  cmd->add_option("--type", *type, "matrix type: f32, f16, q8_0, ...")->capture_default_str();
  cmd->add_option("--seed", s->seed, "random seed")->capture_default_str();
  return [s, out, type]() -> int {
    s->weight_type = type_named(*type);
    if (s->weight_type == GGML_TYPE_COUNT)
      return std::fprintf(stderr, "offgraph synth-mmproj: unknown weight type '%s'\n",
                          type->c_str()),
             1;
    auto summary = synth::write_mmproj(*s, *out);
    if (!summary.ok())
      return std::fprintf(stderr, "offgraph synth-mmproj: %s\n", summary.message().c_str()), 1;
    std::printf("wrote %s: %s\n", out->c_str(), summary->c_str());
    return 0;
  };
}

} // namespace offgraph::cli
