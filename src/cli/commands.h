// The offgraph subcommands, each registered on the CLI11 app in its own file.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace offgraph::cli {

// Each adds its subcommand; the returned function runs it (exit code) when it was chosen.
std::function<int()> add_synth(CLI::App &app);
std::function<int()> add_inspect(CLI::App &app);
std::function<int()> add_logits(CLI::App &app);
std::function<int()> add_run(CLI::App &app);
std::function<int()> add_chat(CLI::App &app);
std::function<int()> add_serve(CLI::App &app);

// A progress bar on stderr for long work; quiet when stderr is not a terminal unless forced.
void progress_bar(const char *what, uint64_t done, uint64_t total);

} // namespace offgraph::cli
