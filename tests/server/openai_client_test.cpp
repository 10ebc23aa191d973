// The official `openai` npm package (pinned by scripts/npm-client.sh) against a live server:
// streaming and non-streaming chat, tool calls, n, legacy completions and errors, as a client
// nobody here wrote sees them.
#include "live_server.h"

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace offgraph::server::testing {
namespace {

std::pair<int, std::string> run_command(const std::string &command) {
  std::string out;
  FILE *p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(OpenAiClient, OfficialNpmClientDrivesTheServer) {
  auto [npm_status, npm_dir] =
      run_command(std::string(OFFGRAPH_SOURCE_DIR) + "/scripts/npm-client.sh");
  ASSERT_EQ(npm_status, 0) << npm_dir;
  while (!npm_dir.empty() && (npm_dir.back() == '\n' || npm_dir.back() == '\r')) npm_dir.pop_back();
  npm_dir = npm_dir.substr(npm_dir.rfind('\n') + 1); // the last line: the directory
  const std::string path = make_model(16, 8, "openai");
  auto model = std::move(model::Model::load(path)).value();
  ServerOptions so = opts("openai-test");
  so.api_key = "sk-offgraph-test";
  Running run(*model, small_engine(1024), so);
  auto [status, out] = run_command(
      "node " + std::string(OFFGRAPH_SOURCE_DIR) + "/tests/server/openai_client.cjs " + npm_dir +
      " http://127.0.0.1:" + std::to_string(run.server->port()) + " " + so.api_key);
  std::printf("%s", out.c_str());
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("12 of 12 checks passed"), std::string::npos);
  fs::remove(path);
}

} // namespace
} // namespace offgraph::server::testing
