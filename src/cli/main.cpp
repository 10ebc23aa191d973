// The offgraph program: subcommands for generating, inspecting and running models.
#include "commands.h"
#include "device_flags.h"

#include "ggml.h"

#include <cstdio>
#include <filesystem>
#include <unistd.h>

namespace offgraph::cli {

void progress_bar(const char *what, uint64_t done, uint64_t total) {
  static bool tty = isatty(2);
  if (!tty || total == 0) return;
  const int width = 40, filled = int(double(done) / double(total) * width);
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%", what, filled,
               "########################################", width - filled, "",
               int(100.0 * double(done) / double(total)));
  if (done >= total) std::fprintf(stderr, "\n");
}

Result<std::string> default_model() {
  namespace fs = std::filesystem;
  const fs::path built = OFFGRAPH_DEFAULT_MODEL;
  std::error_code ec;
  if (fs::is_regular_file(built, ec)) return built.string();
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path near =
        exe.parent_path().parent_path().parent_path() / "models" / built.filename();
    if (fs::is_regular_file(near, ec)) return near.string();
  }
  return Status::error("no model given (-m FILE) and the default model " + built.string() +
                       " is missing");
}

} // namespace offgraph::cli

int main(int argc, char **argv) {
  CLI::App app{
      "offgraph: LLM inference and an OpenAI-compatible server on ggml, with the KV cache kept "
      "off the model graph."};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("-v,--version", version,
               "print offgraph's version and the ggml it was built against");
  auto synth = offgraph::cli::add_synth(app);
  auto synth_mmproj = offgraph::cli::add_synth_mmproj(app);
  auto inspect = offgraph::cli::add_inspect(app);
  auto logits = offgraph::cli::add_logits(app);
  auto run = offgraph::cli::add_run(app);
  auto chat = offgraph::cli::add_chat(app);
  auto serve = offgraph::cli::add_serve(app);
  auto perplexity = offgraph::cli::add_perplexity(app);
  auto bench = offgraph::cli::add_bench(app);
  offgraph::cli::expand_device_flag_aliases(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  if (version) {
    std::printf("offgraph %s (commit %s)\n", OFFGRAPH_VERSION, OFFGRAPH_COMMIT);
    std::printf("ggml %s (commit %s), %s\n", ggml_version(), ggml_commit(),
                OFFGRAPH_GGML_DESCRIPTION);
    return 0;
  }
  if (app.got_subcommand("synth")) return synth();
  if (app.got_subcommand("synth-mmproj")) return synth_mmproj();
  if (app.got_subcommand("inspect")) return inspect();
  if (app.got_subcommand("logits")) return logits();
  if (app.got_subcommand("run")) return run();
  if (app.got_subcommand("chat")) return chat();
  if (app.got_subcommand("serve")) return serve();
  if (app.got_subcommand("perplexity")) return perplexity();
  if (app.got_subcommand("bench")) return bench();
  std::printf("%s", app.help().c_str());
  return 0;
}
