// The official `openai` npm package (pinned by scripts/npm-client.sh) against a live server:
// streaming and non-streaming chat, tool calls, n, legacy completions and errors, as a client
// nobody here wrote sees them; and an image sent the way the README shows it, to a server with a
// synthetic projector.
#include "live_server.h"

#include "engine/images.h"
#include "image_models.h"

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

// The directory scripts/npm-client.sh installed the client into (its output's last line);
// `which` "agents-sdk" for the OpenAI Agents SDK's.
std::string npm_client_dir(const std::string &which = "") {
  auto [npm_status, npm_dir] =
      run_command(std::string(OFFGRAPH_SOURCE_DIR) + "/scripts/npm-client.sh " + which);
  EXPECT_EQ(npm_status, 0) << npm_dir;
  if (npm_status != 0) return "";
  while (!npm_dir.empty() && (npm_dir.back() == '\n' || npm_dir.back() == '\r')) npm_dir.pop_back();
  return npm_dir.substr(npm_dir.rfind('\n') + 1);
}

TEST(OpenAiClient, OfficialNpmClientDrivesTheServer) {
  const std::string npm_dir = npm_client_dir();
  ASSERT_FALSE(npm_dir.empty());
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

// The README's image example: a PNG as a data: URI in an image_url part, usage counting its
// tokens, streamed alike, an https URL refused, the same image again reused.
TEST(OpenAiClient, OfficialNpmClientSendsAnImage) {
  const std::string npm_dir = npm_client_dir();
  ASSERT_FALSE(npm_dir.empty());
  const ImageModelFiles files("openai-image");
  const std::string &text = files.text, &mmproj = files.mmproj;
  const std::string photo =
      (fs::temp_directory_path() / ("offgraph-openai-photo-" + std::to_string(::getpid()) + ".png"))
          .string();
  auto [img_status, img_out] = run_command("/usr/bin/python3 " + std::string(OFFGRAPH_SOURCE_DIR) +
                                           "/tests/peer/make_image.py " + photo + " 320 240 1");
  ASSERT_EQ(img_status, 0) << img_out;
  {
    auto model = std::move(model::Model::load(text)).value();
    auto vision = std::move(model::VisionModel::load(mmproj, 64)).value();
    engine::ImageEncoder encoder(*vision, engine::ImageOptions{});
    auto tok = text::Tokenizer::from_gguf(text);
    ASSERT_TRUE(tok.ok());
    ImageServing images{&encoder,
                        {*(*tok)->find_token("<|patch|>"), *(*tok)->find_token("<|image_start|>"),
                         *(*tok)->find_token("<|image_end|>")}};
    ServerOptions so = opts("offgraph");
    so.api_key = "sk-offgraph-test";
    auto server = std::move(Server::create(*model, small_engine(1024, 32), so, images)).value();
    ASSERT_TRUE(server->start().ok());
    auto [status, out] = run_command("node " + std::string(OFFGRAPH_SOURCE_DIR) +
                                     "/tests/server/openai_image_client.cjs " + npm_dir +
                                     " http://127.0.0.1:" + std::to_string(server->port()) + " " +
                                     so.api_key + " " + photo);
    server->stop();
    std::printf("%s", out.c_str());
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("4 of 4 checks passed"), std::string::npos);
    // What the client was told is what the encoder made: one image, encoded once.
    const auto stats = encoder.stats();
    EXPECT_EQ(stats.encoded, 1);
    EXPECT_GT(stats.rows, 0);
    EXPECT_NE(out.find("image_tokens=" + std::to_string(stats.rows) + " "), std::string::npos)
        << "encoder rows " << stats.rows;
  }
  fs::remove(photo);
}

// openai-node's Responses API (create, stream, parse with zod, previous_response_id, a hosted tool
// refused) and the OpenAI Agents SDK running a function tool through it.
TEST(OpenAiClient, ResponsesApiAndTheAgentsSdk) {
  const std::string npm_dir = npm_client_dir(), agents_dir = npm_client_dir("agents-sdk");
  ASSERT_FALSE(npm_dir.empty());
  ASSERT_FALSE(agents_dir.empty());
  const std::string path = make_model(16, 5, "responses-client");
  auto model = std::move(model::Model::load(path)).value();
  ServerOptions so = opts("responses-client");
  so.api_key = "sk-offgraph-test";
  Running run(*model, small_engine(1024), so);
  auto [status, out] = run_command("node " + std::string(OFFGRAPH_SOURCE_DIR) +
                                   "/tests/server/openai_responses_client.cjs " + npm_dir +
                                   " http://127.0.0.1:" + std::to_string(run.server->port()) + " " +
                                   so.api_key + " responses-client " + agents_dir);
  std::printf("%s", out.c_str());
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("6 of 6 checks passed"), std::string::npos);
  fs::remove(path);
}

// Anthropic's own SDK against the Messages API: create, stream accumulated, a forced tool call
// whose input validates and its tool_result turn, countTokens against the usage of the answer,
// stop sequences, errors.
TEST(AnthropicClient, OfficialSdkDrivesTheMessagesApi) {
  const std::string npm_dir = npm_client_dir();
  ASSERT_FALSE(npm_dir.empty());
  const std::string path = make_model(16, 8, "anthropic");
  auto model = std::move(model::Model::load(path)).value();
  ServerOptions so = opts("anthropic-test");
  so.api_key = "sk-ant-offgraph-test";
  Running run(*model, small_engine(1024), so);
  auto [status, out] = run_command("node " + std::string(OFFGRAPH_SOURCE_DIR) +
                                   "/tests/server/anthropic_client.cjs " + npm_dir +
                                   " http://127.0.0.1:" + std::to_string(run.server->port()) + " " +
                                   so.api_key + " anthropic-test");
  std::printf("%s", out.c_str());
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("8 of 8 checks passed"), std::string::npos);
  fs::remove(path);
}

} // namespace
} // namespace offgraph::server::testing
