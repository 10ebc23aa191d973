// The offgraph program. Subcommands arrive with the layers they expose (run, chat, serve,
// inspect, synth, perplexity); for now it reports what it is and what it was built against.
#include "ggml.h"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace {

void print_version() {
  std::printf("offgraph %s (commit %s)\n", OFFGRAPH_VERSION, OFFGRAPH_COMMIT);
  std::printf("ggml %s (commit %s), %s\n", ggml_version(), ggml_commit(),
              OFFGRAPH_GGML_DESCRIPTION);
}

void print_help(std::FILE *to) {
  std::fprintf(
      to, "offgraph: LLM inference and an OpenAI-compatible server on ggml, with the KV cache\n"
          "kept off the model graph.\n"
          "\n"
          "usage: offgraph [--version | --help]\n"
          "\n"
          "  --version   print offgraph's version and the ggml it was built against\n"
          "  --help      print this help\n"
          "\n"
          "Serving, running and inspecting models arrive with the model and server layers.\n");
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 2 &&
      (std::string_view(argv[1]) == "--version" || std::string_view(argv[1]) == "-v")) {
    print_version();
    return 0;
  }
  if (argc == 1 ||
      (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h"))) {
    print_help(stdout);
    return 0;
  }
  std::fprintf(stderr, "offgraph: unknown argument '%s'\n\n", argv[1]);
  print_help(stderr);
  return 2;
}
