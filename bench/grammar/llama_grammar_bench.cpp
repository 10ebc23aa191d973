// llama_grammar_bench: llama.cpp's side of the structured-output benchmark (bench/grammar/run.py),
// through libllama and libllama-common of the pinned tree (scripts/peer.sh's build): the same
// method as grammar_bench.cpp, with llama.cpp's own API at each step.
//
// For each schema in --schemas DIR (NAME.schema.json, NAME.instance.json), on --vocab (a GGUF
// loaded with vocab_only):
//   1. json_schema_to_grammar (common/json-schema-to-grammar.h) gives a GBNF string, and
//      llama_sampler_init_grammar(vocab, gbnf, "root") parses it into a grammar sampler: both timed
//      (llama-server does both for every request; it keeps no compiled grammar);
//   2. the instance tokenized by llama_tokenize (no BOS, no specials), then the end token;
//   3. a walk over the tokens: at each step llama_sampler_apply on a llama_token_data_array that
//      holds every token id of the vocabulary (arbitrary logits) is timed -- the full mask, as
//      llama-server computes it when it must check all candidates -- the token is checked to have
//      kept a finite logit, and llama_sampler_accept is timed.
// --requests N repeats steps 1-3 (a second request pays the parse again, as in llama-server).
//
// Before each request, untimed, malloc_trim(0) consolidates what the last one freed: glibc would
// otherwise do it inside the next timed allocation (several ms after a long walk).
//
// Output: one JSON object per line per schema on stdout.
#include "json-schema-to-grammar.h"
#include "json.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <sstream>
#include <string>
#include <vector>

namespace {

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

// Minimal JSON writing: this side has no JSON library of its own beyond common_json, and the
// output is flat.
std::string quote(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", x);
  return buf;
}

std::string summary(std::vector<double> v) {
  if (v.empty()) return "{}";
  std::sort(v.begin(), v.end());
  double total = 0;
  for (double x : v) total += x;
  const double median =
      v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  const size_t rank = size_t(std::ceil(0.99 * double(v.size())));
  const double p99 = v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
  return "{\"mean\":" + num(total / double(v.size())) + ",\"median\":" + num(median) +
         ",\"p99\":" + num(p99) + ",\"max\":" + num(v.back()) + ",\"total\":" + num(total) + "}";
}

template <class T> std::string list(const std::vector<T> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ",";
    if constexpr (std::is_floating_point_v<T>)
      out += num(double(v[i]));
    else
      out += std::to_string(v[i]);
  }
  return out + "]";
}

struct Args {
  std::string vocab, schemas, only;
  int requests = 2;
  bool steps = false;
};

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

void quiet_log(ggml_log_level level, const char *text, void *) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

} // namespace

int main(int argc, char **argv) {
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
    else {
      std::fprintf(stderr,
                   "usage: llama_grammar_bench --vocab GGUF --schemas DIR [--only NAME[,NAME]] "
                   "[--requests N] [--steps]\n");
      return 2;
    }
  }
  if (a.vocab.empty() || a.schemas.empty()) {
    std::fprintf(stderr, "--vocab and --schemas are required\n");
    return 2;
  }
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  const auto t_vocab = Clock::now();
  llama_model *model = llama_model_load_from_file(a.vocab.c_str(), mp);
  if (!model) {
    std::fprintf(stderr, "llama.cpp cannot load %s (vocab_only)\n", a.vocab.c_str());
    return 1;
  }
  const llama_vocab *vocab = llama_model_get_vocab(model);
  const double vocab_us = us_since(t_vocab);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  llama_token end_token = llama_vocab_eot(vocab);
  if (end_token == LLAMA_TOKEN_NULL) end_token = llama_vocab_eos(vocab);

  // Every token id, arbitrary logits; restored before each step (untimed).
  std::vector<llama_token_data> pristine(static_cast<size_t>(n_vocab));
  for (int32_t t = 0; t < n_vocab; ++t)
    pristine[size_t(t)] = {t, float((t * 2654435761u) % 1000) / 100.0f, 0.0f};
  std::vector<llama_token_data> work(pristine.size());

  int failures = 0;
  for (const std::string &name : schema_names(a)) {
    const fs::path dir(a.schemas);
    const std::string schema_text = read_text(dir / (name + ".schema.json"));
    const std::string instance = strip_newline(read_text(dir / (name + ".instance.json")));
    std::string out = "{\"side\":\"llama.cpp\",\"schema\":" + quote(name) +
                      ",\"vocab\":" + quote(fs::path(a.vocab).filename().string()) +
                      ",\"n_vocab\":" + std::to_string(n_vocab) +
                      ",\"vocab_setup_us\":" + num(vocab_us);

    std::vector<llama_token> ids(instance.size() + 16);
    const int32_t n =
        llama_tokenize(vocab, instance.c_str(), int32_t(instance.size()), ids.data(),
                       int32_t(ids.size()), /*add_special=*/false, /*parse_special=*/false);
    if (n < 0) {
      std::printf("%s,\"error\":\"llama_tokenize failed\"}\n", out.c_str());
      ++failures;
      continue;
    }
    ids.resize(size_t(n));
    out += ",\"token_ids\":" + list(ids);
    ids.push_back(end_token);
    out +=
        ",\"end_token\":" + std::to_string(end_token) + ",\"tokens\":" + std::to_string(ids.size());

    std::string requests = "[";
    std::string gbnf;
    for (int r = 0; r < a.requests; ++r) {
      std::string error;
      // The previous request's frees consolidated first, untimed (as in grammar_bench.cpp).
      malloc_trim(0);
      // Schema -> GBNF, then the sampler (it parses the GBNF and builds its stacks).
      const auto t_schema = Clock::now();
      try {
        gbnf = json_schema_to_grammar(common_json::parse(schema_text), /*force_gbnf=*/true);
      } catch (const std::exception &e) {
        error = std::string("json_schema_to_grammar: ") + e.what();
      }
      const double schema_us = us_since(t_schema);
      llama_sampler *smpl = nullptr;
      double init_us = 0;
      if (error.empty()) {
        const auto t_init = Clock::now();
        smpl = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
        init_us = us_since(t_init);
        if (!smpl) error = "llama_sampler_init_grammar failed to parse the grammar";
      }
      std::vector<double> mask_us, accept_us;
      std::vector<size_t> allowed;
      for (size_t i = 0; error.empty() && i < ids.size(); ++i) {
        std::memcpy(work.data(), pristine.data(), pristine.size() * sizeof(llama_token_data));
        llama_token_data_array cur = {work.data(), work.size(), -1, false};
        const auto t0 = Clock::now();
        llama_sampler_apply(smpl, &cur);
        mask_us.push_back(us_since(t0));
        size_t live = 0;
        bool kept = false;
        for (size_t k = 0; k < cur.size; ++k)
          if (std::isfinite(cur.data[k].logit)) {
            ++live;
            if (cur.data[k].id == ids[i]) kept = true;
          }
        allowed.push_back(live);
        if (!kept) {
          error = "token " + std::to_string(ids[i]) + " at step " + std::to_string(i) +
                  " is masked out";
          break;
        }
        const auto t1 = Clock::now();
        try {
          llama_sampler_accept(smpl, ids[i]);
        } catch (const std::exception &e) {
          error = "llama_sampler_accept at step " + std::to_string(i) + ": " + e.what();
        }
        accept_us.push_back(us_since(t1));
      }
      if (smpl) llama_sampler_free(smpl);
      size_t allowed_sum = 0;
      for (size_t x : allowed) allowed_sum += x;
      std::string req = "{\"request\":" + std::to_string(r + 1) +
                        ",\"schema_to_grammar_us\":" + num(schema_us) +
                        ",\"init_us\":" + num(init_us) + ",\"mask_us\":" + summary(mask_us) +
                        ",\"accept_us\":" + summary(accept_us) +
                        ",\"steps\":" + std::to_string(mask_us.size()) + ",\"allowed_mean\":" +
                        num(allowed.empty() ? 0.0 : double(allowed_sum) / double(allowed.size()));
      if (a.steps)
        req += ",\"step_mask_us\":" + list(mask_us) + ",\"step_allowed\":" + list(allowed);
      if (!error.empty()) {
        req += ",\"error\":" + quote(error);
        ++failures;
      }
      requests += (r ? "," : "") + req + "}";
    }
    out += ",\"gbnf_bytes\":" + std::to_string(gbnf.size()) + ",\"requests\":" + requests + "]}";
    std::printf("%s\n", out.c_str());
    std::fflush(stdout);
  }
  llama_model_free(model);
  llama_backend_free();
  return failures ? 1 : 0;
}
