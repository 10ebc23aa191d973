#include "speculation_flags.h"

#include "text/tokenizer/tokenizer.h"

namespace offgraph::cli {

void add_speculation_flags(CLI::App &cmd, SpeculationFlags &f) {
  cmd.add_option("--spec-type", f.type,
                 "speculative decoding: none, ngram (drafts from the request's own context) or "
                 "draft (a draft model's, --spec-draft-model); the answer is plain decoding's "
                 "(sampled: same seed, same text where a span's logits equal a step's; see "
                 "--spec-pq)")
      ->capture_default_str();
  cmd.add_option("--spec-draft-model,--model-draft", f.draft_model,
                 "a draft model GGUF with the same vocabulary (requests may then choose "
                 "speculative.type draft)");
  cmd.add_option("--spec-draft-n-max", f.n_max,
                 "most drafted tokens verified per step (clipped to -b - 1: a verify span is at "
                 "most -b tokens, and a rejection is rewound inside the rings)")
      ->capture_default_str();
  cmd.add_option("--spec-draft-n-min", f.n_min, "a shorter draft is not verified")
      ->capture_default_str();
  cmd.add_flag("--spec-fixed-length", f.fixed_length,
               "verify every draft up to --spec-draft-n-max, instead of a length that follows the "
               "acceptance rate and the measured cost of a longer step");
  cmd.add_flag(
      "--spec-pq", f.pq,
      "sampled requests with a draft model: speculative sampling (keep a draft with "
      "probability min(1, p/q)): more drafts kept, but the text for a seed then depends on "
      "the draft lengths; without it drafts are matched against the token sampled, and "
      "the text is plain decoding's");
  cmd.add_option("--spec-ngram-min", f.ngram_min,
                 "n-gram drafts: the shortest suffix of the context that must recur")
      ->capture_default_str();
  cmd.add_option("--spec-ngram-max", f.ngram_max,
                 "n-gram drafts: the longest suffix matched (the longest match wins)")
      ->capture_default_str();
}

Result<std::unique_ptr<model::Model>> load_draft_model(const SpeculationFlags &f,
                                                       const std::string &target_path) {
  if (f.draft_model.empty()) {
    if (f.type == "draft") return Status::error("--spec-type draft needs --spec-draft-model FILE");
    if (f.pq)
      return Status::error("--spec-pq needs --spec-draft-model FILE (it verifies a draft "
                           "model's drafts against their q)");
    return std::unique_ptr<model::Model>();
  }
  auto draft = model::Model::load(f.draft_model);
  if (!draft.ok()) return Status::error("--spec-draft-model: " + draft.message());
  auto mine = text::Tokenizer::from_gguf(target_path);
  auto theirs = text::Tokenizer::from_gguf(f.draft_model);
  if (!mine.ok()) return mine.status();
  if (!theirs.ok()) return Status::error("--spec-draft-model: " + theirs.message());
  if ((*mine)->n_vocab() != (*theirs)->n_vocab())
    return Status::error("--spec-draft-model: " + std::to_string((*theirs)->n_vocab()) +
                         " tokens, the model " + std::to_string((*mine)->n_vocab()));
  for (int32_t id = 0; id < (*mine)->n_vocab(); ++id)
    if ((*mine)->token_piece(id) != (*theirs)->token_piece(id))
      return Status::error("--spec-draft-model: token " + std::to_string(id) + " is '" +
                           (*theirs)->token_piece(id) + "', the model's '" +
                           (*mine)->token_piece(id) + "' (a draft must share the vocabulary)");
  return std::move(draft).value();
}

Result<engine::SpeculationOptions> speculation_options(const SpeculationFlags &f) {
  engine::SpeculationOptions s;
  auto source = engine::parse_draft_source(f.type);
  if (!source.ok()) return Status::error("--spec-type: " + source.message());
  s.source = *source;
  s.n_max = f.n_max, s.n_min = f.n_min, s.adaptive = !f.fixed_length, s.pq = f.pq;
  s.ngram.n_min = f.ngram_min, s.ngram.n_max = f.ngram_max;
  if (Status st = engine::validate(s); !st.ok()) {
    // validate() names the option; say which flag that is.
    const std::string m = st.message();
    const char *flag = m.find("n_max") != std::string::npos      ? "--spec-draft-n-max"
                       : m.find("n_min") != std::string::npos    ? "--spec-draft-n-min"
                       : m.find("shortest") != std::string::npos ? "--spec-ngram-min"
                                                                 : "--spec-ngram-max";
    return Status::error(std::string(flag) + ": " + m);
  }
  return s;
}

} // namespace offgraph::cli
