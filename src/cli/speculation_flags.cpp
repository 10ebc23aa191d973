#include "speculation_flags.h"

namespace offgraph::cli {

void add_speculation_flags(CLI::App &cmd, SpeculationFlags &f) {
  cmd.add_option("--spec-type", f.type,
                 "speculative decoding: none, or ngram (drafts from the request's own context, "
                 "verified so that the tokens are plain decoding's)")
      ->capture_default_str();
  cmd.add_option("--spec-draft-n-max", f.n_max,
                 "most drafted tokens verified per step (clipped to -b - 1: a verify span is at "
                 "most -b tokens, and a rejection is rewound inside the rings)")
      ->capture_default_str();
  cmd.add_option("--spec-draft-n-min", f.n_min, "a shorter draft is not verified")
      ->capture_default_str();
  cmd.add_flag("--spec-fixed-length", f.fixed_length,
               "verify every draft up to --spec-draft-n-max, instead of a length that follows the "
               "acceptance rate and the measured cost of a longer step");
  cmd.add_option("--spec-ngram-min", f.ngram_min,
                 "n-gram drafts: the shortest suffix of the context that must recur")
      ->capture_default_str();
  cmd.add_option("--spec-ngram-max", f.ngram_max,
                 "n-gram drafts: the longest suffix matched (the longest match wins)")
      ->capture_default_str();
}

Result<engine::SpeculationOptions> speculation_options(const SpeculationFlags &f) {
  engine::SpeculationOptions s;
  auto source = engine::parse_draft_source(f.type);
  if (!source.ok()) return Status::error("--spec-type: " + source.message());
  s.source = *source;
  s.n_max = f.n_max, s.n_min = f.n_min, s.adaptive = !f.fixed_length;
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
