// The speculative decoding flags of serve, run and chat (llama-server's names where it has them).
#pragma once

#include "engine/speculation.h"
#include "model/model.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace offgraph::cli {

struct SpeculationFlags {
  std::string type = "none", draft_model;
  int n_max = 8, n_min = 1, ngram_min = 2, ngram_max = 8;
  bool fixed_length = false, pq = false;
};

// Adds --spec-type, --spec-draft-n-max/-n-min, --spec-fixed-length and --spec-ngram-min/-max.
void add_speculation_flags(CLI::App &cmd, SpeculationFlags &flags);
// The options they give; an error naming the flag at fault.
Result<engine::SpeculationOptions> speculation_options(const SpeculationFlags &flags);
// --spec-draft-model loaded (null when not given), refused unless its vocabulary is the target's
// token for token (ids and texts), as llama-server requires of a draft.
Result<std::unique_ptr<model::Model>> load_draft_model(const SpeculationFlags &flags,
                                                       const std::string &target_path);

} // namespace offgraph::cli
