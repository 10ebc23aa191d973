// Images over HTTP (/v1/chat/completions image_url parts): usage counts image rows; the same
// image again is reused (cached tokens past it, the same log-probabilities) and another one
// answers otherwise; hostile and unsupported inputs get a 400 naming the part (http URLs, bad
// base64, other types, oversize, too many, truncated or non-image bytes, images outside user
// messages, 'detail', unknown part types), and a server without --mmproj refuses image parts.
#include "live_server.h"

#include "../image/random_png.h"
#include "engine/images.h"
#include "image_models.h"
#include "server/image_parts.h"

#include <random>

namespace offgraph::server::testing {
namespace {

using Bytes = std::vector<uint8_t>;

struct Files {
  ImageModelFiles paths{"image-server"};
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::VisionModel> vision;
  std::string text = paths.text;
  Files() {
    model = std::move(model::Model::load(paths.text)).value();
    vision = std::move(model::VisionModel::load(paths.mmproj, 64)).value();
  }
};

Files &files() {
  static Files f;
  return f;
}

Bytes png(int w, int h, uint64_t seed) { return offgraph::testing::random_png(w, h, seed); }

json image_part(const std::string &url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}
std::string data_url(const Bytes &b) { return "data:image/png;base64," + base64(b); }

json ask(const std::vector<json> &parts, int max_tokens = 4) {
  json content = json::array();
  for (const json &p : parts) content.push_back(p);
  return {{"messages", {{{"role", "user"}, {"content", content}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"logprobs", true},
          {"top_logprobs", 3}};
}
json text_part(const std::string &t) { return {{"type", "text"}, {"text", t}}; }

struct ImageServer {
  std::unique_ptr<engine::ImageEncoder> encoder;
  std::unique_ptr<Running> run;
  explicit ImageServer(int32_t max_images = 8, int64_t max_bytes = int64_t(1) << 20,
                       int64_t rows_budget = int64_t(1) << 30) {
    engine::ImageOptions io;
    io.max_bytes = max_bytes;
    io.rows_budget = rows_budget;
    encoder = std::make_unique<engine::ImageEncoder>(*files().vision, io);
    auto tok = text::Tokenizer::from_gguf(files().text);
    EXPECT_TRUE(tok.ok());
    ImageServing images{encoder.get(),
                        {*(*tok)->find_token("<|patch|>"), *(*tok)->find_token("<|image_start|>"),
                         *(*tok)->find_token("<|image_end|>")}};
    ServerOptions so = opts("image");
    so.max_images = max_images;
    server_ = std::move(Server::create(*files().model, small_engine(1024, 32), so, images)).value();
    EXPECT_TRUE(server_->start().ok());
    client = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client->set_read_timeout(120, 0);
  }
  ~ImageServer() { server_->stop(); }
  std::pair<int, json> post(const json &body) {
    auto r = client->Post("/v1/chat/completions", body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::unique_ptr<Server> server_;
  std::unique_ptr<httplib::Client> client;
};

TEST(ImageServer, Base64DecodesWhatIsEncodedAndRefusesTheRest) {
  std::mt19937_64 rng(7);
  auto decoded = [](std::string_view text) {
    auto r = decode_base64(text);
    EXPECT_TRUE(r.ok()) << text << ": " << r.message();
    return r.ok() ? std::move(r).value() : Bytes{};
  };
  for (size_t n = 0; n < 200; ++n) {
    Bytes b(n);
    for (auto &x : b) x = uint8_t(rng());
    const std::string e = base64(b);
    EXPECT_EQ(decoded(e), b) << n;
    // Without its padding too (clients that strip it).
    EXPECT_EQ(decoded(e.substr(0, e.find('='))), b) << n;
    // MIME's form: lines of 76 digits with CRLF between them (RFC 2045), or LF, or spaces.
    std::string mime, lf;
    for (size_t i = 0; i < e.size(); i += 76)
      mime += e.substr(i, 76) + "\r\n", lf += e.substr(i, 76) + "\n ";
    EXPECT_EQ(decoded(mime), b) << n;
    EXPECT_EQ(decoded(lf), b) << n;
  }
  EXPECT_EQ(decoded("TWFu"), (Bytes{'M', 'a', 'n'})); // RFC 4648's example
  // Each refusal says what is wrong.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"TWF", "not canonical"},
      {"T", "lone digit"},
      {"TW=u", "after the '=' padding"},
      {"TWFu=", "padding does not complete"},
      {"TWFu===", "more than two '='"},
      {"TW==TW==", "after the '=' padding"},
      {"TWF!", "byte 3 ('!') is not a base64 digit"},
      {"TW-u", "'-'"},
      {std::string("TW\x01u"), "0x01"},
      {"TWG=", "not canonical"}, // "TWG=" and "TR==": bits past the data set
      {"TR==", "not canonical"}};
  for (const auto &[text, needle] : bad) {
    auto r = decode_base64(text);
    EXPECT_FALSE(r.ok()) << text;
    if (!r.ok()) {
      EXPECT_NE(r.message().find(needle), std::string::npos) << text << ": " << r.message();
    }
  }
}

TEST(ImageServer, UsageCountsImageRowsAndReuseFollowsTheImage) {
  ImageServer s;
  const Bytes a = png(100, 70, 1), b = png(100, 70, 2);
  auto [st0, plain] = s.post(ask({text_part("What is this?")}));
  ASSERT_EQ(st0, 200) << plain.dump();
  auto [st1, first] = s.post(ask({image_part(data_url(a)), text_part("What is this?")}));
  ASSERT_EQ(st1, 200) << first.dump();
  const int rows = first["usage"]["prompt_tokens_details"]["image_tokens"];
  EXPECT_EQ(rows, s.encoder->stats().rows);
  EXPECT_GT(rows, 0);
  // The part became <|image_start|>, the rows, <|image_end|> (the template wrote <|patch|>).
  EXPECT_EQ(first["usage"]["prompt_tokens"].get<int>(),
            plain["usage"]["prompt_tokens"].get<int>() + rows + 2);
  EXPECT_FALSE(plain["usage"]["prompt_tokens_details"].contains("image_tokens"));
  // The same image again: encoded once, the prompt reused through the image.
  auto [st2, again] = s.post(ask({image_part(data_url(a)), text_part("What is this?")}));
  ASSERT_EQ(st2, 200);
  EXPECT_EQ(s.encoder->stats().encoded, 1);
  EXPECT_EQ(again["choices"][0]["logprobs"], first["choices"][0]["logprobs"]);
  // The same bytes as a MIME-wrapped data: URI with a parameter and the type in capitals: the
  // same image (not encoded again) and the same answer.
  std::string wrapped;
  const std::string digits = base64(a);
  for (size_t i = 0; i < digits.size(); i += 76) wrapped += digits.substr(i, 76) + "\r\n";
  auto [st4, mime] = s.post(ask(
      {image_part("data:IMAGE/PNG;name=cat.png;base64," + wrapped), text_part("What is this?")}));
  ASSERT_EQ(st4, 200) << mime.dump();
  EXPECT_EQ(s.encoder->stats().encoded, 1);
  EXPECT_EQ(mime["choices"][0]["logprobs"], first["choices"][0]["logprobs"]);
  EXPECT_GE(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            first["usage"]["prompt_tokens"].get<int>() - 16);
  // Another image at the same place: its own rows, recomputed from the image on.
  auto [st3, other] = s.post(ask({image_part(data_url(b)), text_part("What is this?")}));
  ASSERT_EQ(st3, 200);
  EXPECT_NE(other["choices"][0]["logprobs"], first["choices"][0]["logprobs"]);
  // At most what precedes the image: the prompt's head up to the user's message.
  EXPECT_LT(other["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            plain["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(s.encoder->stats().encoded, 2);
}

// The same image through Anthropic's Messages (a base64 image block) and OpenAI's Responses (an
// input_image data URL) makes the prompt Chat Completions' image_url part makes, encoded once.
TEST(ImageServer, MessagesAndResponsesTakeImagesAsChatCompletionsDoes) {
  ImageServer s;
  const Bytes a = png(100, 70, 3);
  auto [st0, chat] = s.post(ask({image_part(data_url(a)), text_part("What is this?")}));
  ASSERT_EQ(st0, 200) << chat.dump();
  const int prompt = chat["usage"]["prompt_tokens"];
  json messages = {
      {"model", "image"},
      {"max_tokens", 2},
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "image"},
            {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", base64(a)}}}},
           {{"type", "text"}, {"text", "What is this?"}}}}}}}};
  auto m = s.client->Post("/v1/messages", messages.dump(), "application/json");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200) << m->body;
  const json mu = json::parse(m->body)["usage"];
  EXPECT_EQ(mu["input_tokens"].get<int>() + mu["cache_read_input_tokens"].get<int>(), prompt);
  json responses = {{"model", "image"},
                    {"max_output_tokens", 2},
                    {"input",
                     {{{"role", "user"},
                       {"content",
                        {{{"type", "input_image"}, {"image_url", data_url(a)}},
                         {{"type", "input_text"}, {"text", "What is this?"}}}}}}}};
  auto r = s.client->Post("/v1/responses", responses.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["input_tokens"].get<int>(), prompt);
  EXPECT_EQ(s.encoder->stats().encoded, 1); // the same image: encoded once for all three
}

// Images that cannot fit the context are refused before any is encoded: their rows are counted
// from the decoded sizes. Each of these fits alone (600 rows in a 1,024 context); together they
// do not.
TEST(ImageServer, ImagesPastTheContextAreRefusedBeforeEncoding) {
  ImageServer s(8, int64_t(8) << 20);
  const Bytes a = png(840, 560, 21), b = png(840, 560, 22); // 30 x 20 cells of 28 px
  auto [st1, both] =
      s.post(ask({image_part(data_url(a)), image_part(data_url(b)), text_part("Compare them.")}));
  EXPECT_EQ(st1, 400) << both.dump();
  EXPECT_EQ(both["error"]["code"], "context_length_exceeded") << both.dump();
  EXPECT_NE(both["error"]["message"].get<std::string>().find("1024"), std::string::npos);
  EXPECT_EQ(s.encoder->stats().encoded, 0);
  // One of them fits: encoded once, its rows as counted.
  auto [st2, one] = s.post(ask({image_part(data_url(a)), text_part("Describe it.")}));
  ASSERT_EQ(st2, 200) << one.dump();
  EXPECT_EQ(one["usage"]["prompt_tokens_details"]["image_tokens"], 600);
  EXPECT_EQ(s.encoder->stats().encoded, 1);
  // Counted from the cache now: the same refusal, nothing encoded.
  auto [st3, again] =
      s.post(ask({image_part(data_url(a)), image_part(data_url(a)), text_part("Twice.")}));
  EXPECT_EQ(st3, 400) << again.dump();
  EXPECT_EQ(s.encoder->stats().encoded, 1);
}

// Under an image memory budget of one image's rows: two images in one request can never fit and
// are refused by name before any is encoded (not left waiting for room that cannot come); one
// fits, and /metrics counts its rows against the budget (alive in the cache) and never past it.
TEST(ImageServer, ImagesPastTheImageMemoryBudgetAreRefusedByName) {
  const Bytes a = png(280, 280, 23), b = png(280, 280, 24);
  engine::ImageEncoder probe(*files().vision, {});
  const int64_t one = probe.rows_bytes(probe.count_rows(a).value());
  ImageServer s(8, int64_t(8) << 20, one);
  auto [st1, both] =
      s.post(ask({image_part(data_url(a)), image_part(data_url(b)), text_part("Both.")}, 2));
  EXPECT_EQ(st1, 400) << both.dump();
  EXPECT_NE(both["error"]["message"].get<std::string>().find("--image-mib"), std::string::npos)
      << both.dump();
  EXPECT_EQ(s.encoder->stats().encoded, 0);
  auto [st2, fits] = s.post(ask({image_part(data_url(a)), text_part("Describe it.")}, 2));
  ASSERT_EQ(st2, 200) << fits.dump();
  EXPECT_EQ(s.encoder->stats().live_bytes, one); // in the cache
  EXPECT_EQ(s.encoder->stats().reserved_bytes, 0);
  // The same image again is taken from the cache, not reserved and encoded anew (reserving it
  // would drop it from the cache to make the room).
  auto [st3, again] = s.post(ask({image_part(data_url(a)), text_part("Again.")}, 2));
  ASSERT_EQ(st3, 200) << again.dump();
  EXPECT_EQ(s.encoder->stats().encoded, 1);
  // Twice in one request: room for it once, and encoded once.
  auto [st4, twice] =
      s.post(ask({image_part(data_url(b)), image_part(data_url(b)), text_part("Twice.")}, 2));
  ASSERT_EQ(st4, 200) << twice.dump();
  EXPECT_EQ(s.encoder->stats().encoded, 2);
  auto m = s.client->Get("/metrics");
  ASSERT_TRUE(m);
  const std::string row = "offgraph_memory_used_bytes{budget=\"image_rows\",flag=\"--image-mib\"} ";
  const size_t at = m->body.find(row);
  ASSERT_NE(at, std::string::npos) << m->body;
  EXPECT_EQ(std::stoll(m->body.substr(at + row.size())), one);
  EXPECT_NE(
      m->body.find("offgraph_memory_budget_bytes{budget=\"image_rows\",flag=\"--image-mib\"} " +
                   std::to_string(one)),
      std::string::npos);
}

TEST(ImageServer, BadImagePartsAreRefusedByName) {
  ImageServer s(2, 4000);
  const Bytes a = png(30, 30, 3);
  auto refused = [&](const json &body, const std::string &needle, const std::string &param) {
    auto [st, r] = s.post(body);
    EXPECT_EQ(st, 400) << r.dump();
    const std::string m = r["error"]["message"].is_string() ? r["error"]["message"] : "";
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    if (!param.empty()) {
      EXPECT_EQ(r["error"]["param"], param) << r.dump();
    }
  };
  const std::string p0 = "messages[0].content[0].image_url";
  refused(ask({image_part("https://example.com/cat.png")}), "not fetched", p0 + ".url");
  refused(ask({image_part("data:image/png;base64,@@@@")}),
          "not valid base64: byte 0 ('@') is not a base64 digit", p0 + ".url");
  refused(ask({image_part("data:image/png;charset;base64," + base64(a))}), "'charset'",
          p0 + ".url");
  refused(ask({image_part("data:image/png," + base64(a))}), "must be base64", p0 + ".url");
  refused(ask({image_part("data:image/webp;base64," + base64(a))}), "image/webp", p0 + ".url");
  refused(ask({image_part("ftp://x")}), "data: URI", p0 + ".url");
  refused(ask({image_part(data_url(png(200, 200, 4)))}), "at most 4000", p0 + ".url");
  refused(ask({image_part(data_url(a)), image_part(data_url(a)), image_part(data_url(a))}),
          "more than 2 images", "messages[0].content[2].image_url");
  const std::string hello = "hello, not an image";
  refused(ask({image_part(data_url(Bytes(hello.begin(), hello.end())))}), "messages[0].content[0]",
          p0);
  Bytes cut(a.begin(), a.begin() + long(a.size() / 2));
  refused(ask({image_part(data_url(cut))}), "messages[0].content[0]", p0);
  json detail = ask({image_part(data_url(a))});
  detail["messages"][0]["content"][0]["image_url"]["detail"] = "low";
  refused(detail, "'detail'", p0 + ".detail");
  json audio = ask({{{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}}}}});
  refused(audio, "'input_audio'", "messages[0].content[0]");
  json system = ask({text_part("hi")});
  system["messages"] = json::array({{{"role", "system"}, {"content", {image_part(data_url(a))}}},
                                    {{"role", "user"}, {"content", "hi"}}});
  refused(system, "user messages only", "messages[0].content[0]");
  json no_text = ask({{{"type", "text"}}});
  refused(no_text, "without a 'text'", "messages[0].content[0]");
  // The server still answers.
  auto [st, ok] = s.post(ask({image_part(data_url(a)), text_part("and now?")}));
  EXPECT_EQ(st, 200) << ok.dump();
}

TEST(ImageServer, WithoutAProjectorImagePartsAreRefused) {
  Running run(*files().model, small_engine(), opts("plain"));
  auto [st, r] = run.post("/v1/chat/completions", ask({image_part(data_url(png(30, 30, 5)))}));
  EXPECT_EQ(st, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("--mmproj"), std::string::npos);
}

} // namespace
} // namespace offgraph::server::testing
