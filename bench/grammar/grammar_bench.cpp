// grammar_bench: offgraph's side of the structured-output benchmark (issue 16,
// bench/grammar/run.py).
//
// For each schema in --schemas DIR (NAME.schema.json with its valid instance NAME.instance.json,
// compact, properties in schema order), on one vocabulary (--vocab: a GGUF file, vocab-only or a
// whole model):
//   1. schema -> Grammar (json_schema_grammar) and compile_grammar against the vocabulary, timed
//      (mask tables are computed per stack context on first use, inside the first request's masks,
//      and reported from compile_stats after each request; precompute_all on a second compilation
//      is timed beside);
//   2. the instance tokenized by the vocabulary's own tokenizer (text::Tokenizer, no BOS, no
//      specials), followed by the vocabulary's end-of-generation token;
//   3. a walk over those tokens: at each step fill_mask over the whole vocabulary is timed, the
//      token is checked against the mask (it must be allowed), and accept_token is timed.
// The walk runs once "cold" and then --requests times (default 2) on a warmed vocabulary, each
// with a fresh GrammarMatcher (whose per-state mask cache starts empty, as for every request):
//   cold:   compiled against a vocabulary of its own, which holds no table yet (a process's very
//           first constrained request, with no warm-up);
//   first:  compiled against a vocabulary that warm_json_tables filled beforehand, as
//           `offgraph serve` does at startup (timed: "warm_up_us"): a server's first request with
//           this schema, paying the compilation and the tables no warm-up grammar shares;
//   cached: the compiled grammar again, as the server's grammar cache reuses it.
// Each schema gets vocabularies of its own, so that schemas do not warm each other.
//
// The 262K vocabulary is gemma-4's (models/ggml-vocab-gemma-4.gguf, the largest real one here),
// standing in for the real 202K Muse Glimmer vocabulary, which is not on this machine.
//
// Before each request, untimed, malloc_trim(0) consolidates what the last one freed: glibc would
// otherwise do it inside the next timed allocation (several ms after a long walk).
//
// Output: one JSON object per line per schema on stdout (bench/grammar/run.py reads them).
#include "sample/grammar.h"
#include "sample/grammar_matcher.h"
#include "sample/json_schema.h"
#include "text/atem/atem_grammar.h"
#include "text/tokenizer/tokenizer.h"

#include <gguf.h>
#include <malloc.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace offgraph;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::string read_text(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string strip_newline(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

struct Summary {
  double mean = 0, median = 0, p99 = 0, max = 0, total = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  for (double x : v) s.total += x;
  s.mean = s.total / double(v.size());
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  // Nearest rank: the smallest value with at least 99% of the samples at or below it.
  const size_t rank = size_t(std::ceil(0.99 * double(v.size())));
  s.p99 = v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
  s.max = v.back();
  return s;
}

nlohmann::json to_json(const Summary &s) {
  return {
      {"mean", s.mean}, {"median", s.median}, {"p99", s.p99}, {"max", s.max}, {"total", s.total}};
}

// A vocabulary as grammars read it, and what tokenizes text for it (null: ids come from a file).
struct Vocab {
  std::shared_ptr<const sample::TokenTexts> texts;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::vector<int32_t> end_tokens;
  std::string model; // tokenizer.ggml.model
  std::string pre;
};

std::string gguf_string(const gguf_context *ctx, const char *key) {
  const int64_t k = gguf_find_key(ctx, key);
  return k < 0 ? std::string() : std::string(gguf_get_val_str(ctx, k));
}

Vocab load_vocab(const std::string &path) {
  gguf_init_params params{true, nullptr};
  gguf_context *ctx = gguf_init_from_file(path.c_str(), params);
  if (!ctx) {
    std::fprintf(stderr, "cannot read GGUF %s\n", path.c_str());
    std::exit(1);
  }
  Vocab v;
  auto tok = text::Tokenizer::from_gguf(ctx);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer: %s\n", tok.status().message().c_str());
    std::exit(1);
  }
  v.tokenizer = std::move(tok.value());
  v.texts = text::grammar_token_texts(*v.tokenizer);
  v.end_tokens = v.tokenizer->end_of_generation_ids();
  v.model = gguf_string(ctx, "tokenizer.ggml.model");
  v.pre = v.tokenizer->pre_tokenizer_name();
  gguf_free(ctx);
  std::sort(v.end_tokens.begin(), v.end_tokens.end());
  v.end_tokens.erase(std::unique(v.end_tokens.begin(), v.end_tokens.end()), v.end_tokens.end());
  return v;
}

bool test_bit(const std::vector<uint64_t> &bits, int32_t t) {
  return (bits[size_t(t) >> 6] >> (size_t(t) & 63)) & 1;
}

size_t popcount(const std::vector<uint64_t> &bits) {
  size_t n = 0;
  for (uint64_t w : bits) n += size_t(std::popcount(w));
  return n;
}

struct Args {
  std::string vocab, schemas, only;
  int requests = 2;
  bool steps = false;     // per-step detail in the JSON
  bool precompute = true; // also time precompute_all on a second compilation
  int samples = 0;        // random walks through the masks, written out for validation
};

Args parse_args(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--vocab")
      a.vocab = next();
    else if (k == "--schemas")
      a.schemas = next();
    else if (k == "--only")
      a.only = next();
    else if (k == "--requests")
      a.requests = std::max(1, std::atoi(next().c_str()));
    else if (k == "--steps")
      a.steps = true;
    else if (k == "--no-precompute")
      a.precompute = false;
    else if (k == "--sample")
      a.samples = std::max(0, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "usage: grammar_bench --vocab GGUF --schemas DIR [--only NAME[,NAME]] "
                           "[--requests N] [--steps] [--no-precompute] [--sample K]\n");
      std::exit(2);
    }
  }
  if (a.vocab.empty() || a.schemas.empty()) {
    std::fprintf(stderr, "--vocab and --schemas are required\n");
    std::exit(2);
  }
  return a;
}

std::vector<std::string> schema_names(const Args &a) {
  std::vector<std::string> names;
  if (!a.only.empty()) {
    std::stringstream ss(a.only);
    for (std::string s; std::getline(ss, s, ',');)
      if (!s.empty()) names.push_back(s);
    return names;
  }
  for (const auto &e : fs::directory_iterator(a.schemas)) {
    const std::string f = e.path().filename().string();
    const std::string suffix = ".schema.json";
    if (f.size() > suffix.size() && f.ends_with(suffix))
      names.push_back(f.substr(0, f.size() - suffix.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// `count` answers drawn through the masks (seeds 1..count): uniformly from the allowed tokens for
// the first 48 steps, then favouring the end token and short tokens (which close strings, arrays
// and objects), up to 1,500 tokens. What corpus.py checks with python3-jsonschema: an answer the
// masks let through must validate.
nlohmann::json random_walks(const std::shared_ptr<const sample::CompiledGrammar> &grammar,
                            const Vocab &vocab, int count) {
  nlohmann::json out = nlohmann::json::array();
  std::vector<uint64_t> bits;
  for (int k = 1; k <= count; ++k) {
    std::mt19937 rng{uint32_t(k)};
    sample::GrammarMatcher m(grammar);
    std::string text, error;
    size_t steps = 0;
    for (; steps < 1500 && !m.finished(); ++steps) {
      if (Status s = m.fill_mask(bits); !s.ok()) {
        error = s.message();
        break;
      }
      std::vector<int32_t> allowed, end, shortest;
      size_t shortest_len = SIZE_MAX;
      for (size_t t = 0; t < vocab.texts->bytes.size(); ++t) {
        if (!test_bit(bits, int32_t(t))) continue;
        allowed.push_back(int32_t(t));
        if (std::find(vocab.end_tokens.begin(), vocab.end_tokens.end(), int32_t(t)) !=
            vocab.end_tokens.end())
          end.push_back(int32_t(t));
        const size_t len = vocab.texts->bytes[t].size();
        if (len && len < shortest_len) shortest.clear(), shortest_len = len;
        if (len && len == shortest_len) shortest.push_back(int32_t(t));
      }
      if (allowed.empty()) {
        error = "no token allowed";
        break;
      }
      const bool late = steps >= 48;
      const std::vector<int32_t> &from = late && !end.empty()                     ? end
                                         : late && !shortest.empty() && rng() % 4 ? shortest
                                                                                  : allowed;
      const int32_t pick = from[rng() % from.size()];
      if (!m.accept_token(pick)) {
        error = "accept_token refused an allowed token";
        break;
      }
      if (!vocab.texts->special[size_t(pick)]) text += vocab.texts->bytes[size_t(pick)];
    }
    out.push_back({{"seed", k},
                   {"text", text},
                   {"finished", m.finished()},
                   {"tokens", steps},
                   {"error", error}});
  }
  return out;
}

} // namespace

int main(int argc, char **argv) {
  const Args args = parse_args(argc, argv);
  const auto t_vocab = Clock::now();
  Vocab vocab = load_vocab(args.vocab);
  auto gv = std::make_shared<const sample::GrammarVocabulary>(vocab.texts);
  const double vocab_us = us_since(t_vocab);
  const size_t trie_nodes = gv->nodes().size();
  gv.reset();
  if (vocab.end_tokens.empty()) {
    std::fprintf(stderr, "the vocabulary names no end-of-generation token\n");
    return 1;
  }
  const int32_t end_token = vocab.end_tokens.front();
  int failures = 0;

  for (const std::string &name : schema_names(args)) {
    const fs::path dir(args.schemas);
    const std::string schema_text = read_text(dir / (name + ".schema.json"));
    const std::string instance = strip_newline(read_text(dir / (name + ".instance.json")));
    nlohmann::json out = {{"side", "offgraph"},
                          {"schema", name},
                          {"vocab", fs::path(args.vocab).filename().string()},
                          {"n_vocab", vocab.texts->bytes.size()},
                          {"vocab_setup_us", vocab_us},
                          {"trie_nodes", trie_nodes},
                          {"instance_bytes", instance.size()}};

    // Vocabularies of this schema's own: one left cold, one warmed as `offgraph serve` warms its
    // own at startup (server/structured.h; completions and models without a chat format write
    // plain JSON, which is what these grammars are).
    auto cold_gv = std::make_shared<const sample::GrammarVocabulary>(vocab.texts);
    auto warm_gv = std::make_shared<const sample::GrammarVocabulary>(vocab.texts);
    malloc_trim(0);
    const auto t_warm = Clock::now();
    const Status warmed = sample::warm_json_tables(warm_gv, {});
    out["warm_up_us"] = us_since(t_warm);
    out["warm_up_tables"] = warm_gv->shared_tables();
    if (!warmed.ok()) {
      out["error"] = "warm_json_tables: " + warmed.message();
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
      ++failures;
      continue;
    }

    // Schema -> Grammar, then compilation (the compiled grammar is what the server caches). The
    // previous schema's frees are consolidated first, untimed (glibc does it on the next large
    // allocation, which would otherwise be timed here).
    malloc_trim(0);
    const auto t_schema = Clock::now();
    const auto schema = nlohmann::ordered_json::parse(schema_text);
    auto grammar = sample::json_schema_grammar(schema);
    const double schema_us = us_since(t_schema);
    if (!grammar.ok()) {
      out["error"] = "json_schema_grammar: " + grammar.status().message();
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
      ++failures;
      continue;
    }
    const size_t rules = grammar.value().rules.size();
    // Kept for the check at the end (grammar_accepts): run here, its allocations would land in
    // the compilation's time (glibc consolidates the freed chunks on the next large allocation).
    const sample::Grammar reference = grammar.value();
    auto cold = sample::compile_grammar(grammar.value(), cold_gv, vocab.end_tokens);
    const auto t_compile = Clock::now();
    auto compiled = sample::compile_grammar(std::move(grammar.value()), warm_gv, vocab.end_tokens);
    const double compile_wall_us = us_since(t_compile);
    if (!compiled.ok() || !cold.ok()) {
      out["error"] = "compile_grammar: " + (compiled.ok() ? cold : compiled).status().message();
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
      ++failures;
      continue;
    }
    const sample::GrammarCompileStats stats = sample::compile_stats(*compiled.value());
    out["schema_to_grammar_us"] = schema_us;
    out["grammar_rules"] = rules;
    out["compile_us"] = stats.seconds * 1e6;
    out["compile_wall_us"] = compile_wall_us;
    out["terminal_positions"] = stats.terminal_positions;
    out["tables_at_compile"] = stats.computed_tables;
    std::vector<int32_t> ids =
        vocab.tokenizer->encode(instance, /*add_bos=*/false, /*parse_special=*/false);
    out["tokenized_by"] = "offgraph";
    out["token_ids"] = ids;
    std::string spelled;
    for (int32_t t : ids) spelled += vocab.texts->bytes[size_t(t)];
    out["token_ids_spell_instance"] = spelled == instance;
    ids.push_back(end_token);
    out["tokens"] = ids.size();

    nlohmann::json requests = nlohmann::json::array();
    std::vector<uint64_t> bits;
    for (int r = 0; r <= args.requests; ++r) {
      if (r > 0) malloc_trim(0); // likewise between requests
      const auto &grammar_here = r == 0 ? cold.value() : compiled.value();
      sample::GrammarMatcher m(grammar_here);
      std::vector<double> mask_us, accept_us;
      std::vector<size_t> allowed;
      std::string error;
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto t0 = Clock::now();
        const Status s = m.fill_mask(bits);
        mask_us.push_back(us_since(t0));
        if (!s.ok()) {
          error = "fill_mask at step " + std::to_string(i) + ": " + s.message();
          break;
        }
        allowed.push_back(popcount(bits));
        if (!test_bit(bits, ids[i])) {
          error = "token " + std::to_string(ids[i]) + " (" +
                  nlohmann::json(vocab.texts->bytes[size_t(ids[i])]).dump() + ") at step " +
                  std::to_string(i) + " is masked out";
          break;
        }
        const auto t1 = Clock::now();
        const bool ok = m.accept_token(ids[i]);
        accept_us.push_back(us_since(t1));
        if (!ok) {
          error = "accept_token refused token " + std::to_string(ids[i]) + " at step " +
                  std::to_string(i);
          break;
        }
      }
      if (error.empty() && !m.finished()) error = "the end token did not finish the grammar";
      // Position tables computed so far (lazily, by this and earlier requests' masks).
      const sample::GrammarCompileStats after = sample::compile_stats(*grammar_here);
      nlohmann::json req = {{"request", r + 1},
                            {"kind", r == 0   ? "cold"
                                     : r == 1 ? "first"
                                              : "cached"},
                            {"tables_shared", after.shared_tables},
                            {"tables_refined", after.refined_tables},
                            {"trie_nodes_walked", after.trie_nodes_walked},
                            {"mask_us", to_json(summarize(mask_us))},
                            {"accept_us", to_json(summarize(accept_us))},
                            {"steps", mask_us.size()},
                            {"tables_computed", after.computed_tables},
                            {"table_us_so_far", after.table_seconds * 1e6},
                            {"uncertain_sum_so_far", after.uncertain}};
      size_t allowed_sum = 0;
      for (size_t a : allowed) allowed_sum += a;
      req["allowed_mean"] = allowed.empty() ? 0.0 : double(allowed_sum) / double(allowed.size());
      if (args.steps) {
        req["step_mask_us"] = mask_us;
        req["step_allowed"] = allowed;
      }
      if (!error.empty()) {
        req["error"] = error;
        ++failures;
      }
      requests.push_back(req);
    }
    out["requests"] = requests;
    if (args.samples > 0) out["samples"] = random_walks(compiled.value(), vocab, args.samples);
    // precompute_all on a second compilation: a table for every position with nothing known below
    // it (the matcher computes tables per stack context on first use, inside the first request's
    // masks; this is the context-free worst case the header describes). After the walks, so that
    // its allocations stay out of their times.
    if (args.precompute) {
      // A vocabulary of its own: no table made before.
      auto eager = sample::compile_grammar(
          reference, std::make_shared<const sample::GrammarVocabulary>(vocab.texts),
          vocab.end_tokens);
      if (eager.ok()) {
        const auto t_all = Clock::now();
        sample::precompute_all(*eager.value());
        const double all_us = us_since(t_all);
        const sample::GrammarCompileStats es = sample::compile_stats(*eager.value());
        out["all_tables_us"] = all_us;
        out["all_tables_uncertain_sum"] = es.uncertain;
        out["all_tables_accepted_listed_sum"] = es.accepted;
      }
    }

    {
      auto accepts = sample::grammar_accepts(reference, instance);
      out["grammar_accepts_instance"] = accepts.ok() && accepts.value();
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
  return failures ? 1 : 0;
}
