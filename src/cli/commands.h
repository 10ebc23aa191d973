// The offgraph subcommands, each registered on the CLI11 app in its own file.
#pragma once

#include "base/status.h"

#include <CLI/CLI.hpp>

#include <functional>

namespace offgraph::cli {

// Each adds its subcommand; the returned function runs it (exit code) when it was chosen.
std::function<int()> add_synth(CLI::App &app);
std::function<int()> add_synth_mmproj(CLI::App &app);
std::function<int()> add_inspect(CLI::App &app);
std::function<int()> add_logits(CLI::App &app);
std::function<int()> add_run(CLI::App &app);
std::function<int()> add_chat(CLI::App &app);
std::function<int()> add_serve(CLI::App &app);
std::function<int()> add_perplexity(CLI::App &app);
std::function<int()> add_bench(CLI::App &app);

// A progress bar on stderr for long work; quiet when stderr is not a terminal unless forced.
void progress_bar(const char *what, uint64_t done, uint64_t total);

// The model used when -m is not given: the trained model shipped in the checkout's models/ (its
// path at build time, else models/ two levels above the executable); an error naming -m if absent.
Result<std::string> default_model();

} // namespace offgraph::cli
