// Prompts with embedding rows (images) through the engine: the answer equals a reference that
// runs the whole prompt as one forward batch with the rows in place (chunks of 8 split images;
// rings of window 16 wrap inside them), batched beside text requests; prefix reuse keys image
// rows by their ids (the same image resent is reused, another one is not); a match ending inside
// an image's rows does not reuse them (mutation: a snapshot reaching into the image would); n-gram
// drafts and penalties never treat row ids as tokens; malformed inputs are refused by name.
#include "engine/images.h"
#include "engine_util.h"
#include "kv/kv_store.h"
#include "model/forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace offgraph::engine::testing {
namespace {

constexpr int32_t kBegin = 497, kEnd = 498; // stand-ins for <|image_start|> / <|image_end|>

// A digest standing for an image's bytes.
ImageDigest digest_of(uint8_t n) {
  ImageDigest d{};
  d[0] = n;
  return d;
}

// A prompt of text, then images, each between kBegin and kEnd with ids from image_row_ids(digest).
struct Part {
  std::vector<int32_t> text;
  std::shared_ptr<const model::EncodedImage> image; // null: text only
  uint8_t digest = 0;
};
Request image_request(const std::vector<Part> &parts, int32_t n) {
  Request r = greedy({}, n);
  for (const Part &p : parts) {
    r.prompt.insert(r.prompt.end(), p.text.begin(), p.text.end());
    if (!p.image) continue;
    r.prompt.push_back(kBegin);
    r.embeddings.push_back({int32_t(r.prompt.size()), p.image});
    const auto ids = image_row_ids(digest_of(p.digest), p.image->n_rows, 500);
    r.prompt.insert(r.prompt.end(), ids.begin(), ids.end());
    r.prompt.push_back(kEnd);
  }
  return r;
}

// The reference: the whole prompt as one batch with its embedding rows, then greedy steps.
std::vector<int32_t> reference(const Request &r) {
  const model::Model &m = *fixture().model;
  const int32_t n = int32_t(r.prompt.size());
  auto layout = model::make_layout(m, {256, n});
  auto store =
      kv::KvStore::create(*layout, {GGML_TYPE_F32, GGML_TYPE_F32}, ggml_backend_cpu_buffer_type());
  EXPECT_TRUE(store.ok()) << store.message();
  model::Forward fwd(m, **store, 2);
  const kv::SeqId seq = *(*store)->create_sequence();
  model::Batch b;
  b.tokens = r.prompt;
  b.spans.push_back({seq, 0, n});
  b.logit_rows = {n - 1};
  for (const auto &e : r.embeddings)
    for (int32_t i = 0; i < e.rows->n_rows; ++i) {
      b.embedding_at.push_back(e.at + i);
      const float *row = e.rows->rows.data() + size_t(i) * size_t(e.rows->width);
      b.embeddings.insert(b.embeddings.end(), row, row + e.rows->width);
    }
  std::vector<int32_t> out;
  for (int32_t pos = n; int32_t(out.size()) < r.max_tokens; ++pos) {
    auto logits = fwd.run(b);
    EXPECT_TRUE(logits.ok()) << logits.message();
    if (!logits.ok()) return out;
    out.push_back(int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    b = {};
    b.tokens = {out.back()};
    b.spans.push_back({seq, pos, 1});
    b.logit_rows = {0};
  }
  return out;
}

// Runs one request, returning its tokens and the prompt tokens it reused.
std::pair<std::vector<int32_t>, int32_t> run_one(Engine &engine, const Request &r) {
  std::vector<int32_t> out;
  int32_t reused = -1;
  auto id = engine.submit(r, [&](const Event &e) {
    if (e.token >= 0) out.push_back(e.token);
    if (e.finish != FinishReason::None) reused = e.cached_tokens;
    EXPECT_NE(e.finish, FinishReason::Error) << e.error;
  });
  EXPECT_TRUE(id.ok()) << id.message();
  engine.run_until_idle();
  return {out, reused};
}

std::vector<int32_t> text(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  auto t = random_tokens(rng, n);
  for (int32_t &x : t) x = x % 490; // clear of kBegin / kEnd
  return t;
}

TEST(ImagePrompt, EqualsTheWholePromptAsOneBatchBesideTextRequests) {
  const auto a = random_image(1, 13), b = random_image(2, 20);
  const Request img =
      image_request({{text(1, 10), a, 11}, {text(2, 7), b, 12}, {text(3, 5), nullptr}}, 12);
  const std::vector<int32_t> want = reference(img);
  // Alone, then beside two text requests (mixed batches: embedding rows and token rows).
  EXPECT_EQ(alone(img), want);
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok()) << e.message();
  const Request t1 = greedy(text(7, 30), 12), t2 = greedy(text(8, 9), 12);
  auto out = run(**e, {t1, img, t2});
  EXPECT_EQ(out[1], want);
  EXPECT_EQ(out[0], alone(t1));
  EXPECT_EQ(out[2], alone(t2));
  // The rows matter: the same prompt with another image's rows (same ids) answers otherwise.
  Request other = img;
  other.embeddings[1].rows = random_image(3, 20);
  EXPECT_NE(reference(other), want);
}

TEST(ImagePrompt, ReuseFollowsTheImage) {
  const auto a = random_image(4, 18), c = random_image(5, 18);
  auto e = Engine::create(*fixture().model, options(4));
  ASSERT_TRUE(e.ok()) << e.message();
  const Request first = image_request({{text(4, 12), a, 41}, {text(5, 6), nullptr}}, 6);
  const auto [out1, reused1] = run_one(**e, first);
  EXPECT_EQ(out1, reference(first));
  EXPECT_EQ(reused1, 0);
  // The same image again, with a longer question after it: everything before the edit is reused.
  const Request again = image_request({{text(4, 12), a, 41}, {text(5, 9), nullptr}}, 6);
  const auto [out2, reused2] = run_one(**e, again);
  EXPECT_EQ(out2, reference(again));
  EXPECT_GE(reused2, 12 + 1 + 18 + 1 + 6 - 7); // a snapshot of the first prompt's end reaching back
  // Another image at the same place: nothing of the image is reused.
  const Request changed = image_request({{text(4, 12), c, 42}, {text(5, 9), nullptr}}, 6);
  const auto [out3, reused3] = run_one(**e, changed);
  EXPECT_EQ(out3, reference(changed));
  EXPECT_LE(reused3, 13);
}

TEST(ImagePrompt, AMatchEndingInsideAnImageReusesNoneOfItsRows) {
  // Image A' shares its first 15 row ids with A (a chance collision of 31-bit ids, forced) but not
  // its rows. The first prompt's end snapshot reaches back 16 tokens, into the image: without the
  // whole-image rule the second request would resume there, on A's rows.
  const auto a = random_image(6, 20), a2 = random_image(7, 20);
  auto e = Engine::create(*fixture().model, options(4));
  ASSERT_TRUE(e.ok()) << e.message();
  const Request first = image_request({{text(6, 10), a, 61}, {{3, 4}, nullptr}}, 4);
  EXPECT_EQ(run_one(**e, first).first, reference(first));
  Request second = first;
  second.embeddings[0].rows = a2;
  const auto other = image_row_ids(digest_of(62), 20, 500);
  std::copy(other.begin() + 15, other.end(), second.prompt.begin() + 11 + 15);
  const auto [out, reused] = run_one(**e, second);
  EXPECT_EQ(out, reference(second));
  EXPECT_LE(reused, 11); // at most the text before the image
}

TEST(ImagePrompt, NgramDraftsAndPenaltiesSkipImageRows) {
  // The text before each image ends with the answer's first token, so that the first n-gram
  // draft (from a 1-token suffix) is <|image_start|> and the image's row ids: found by iterating
  // to a fixed point.
  const auto a = random_image(8, 9);
  std::vector<int32_t> t = text(9, 6);
  Request r;
  std::vector<int32_t> plain;
  for (int i = 0; i < 20; ++i) {
    r = image_request({{t, a, 81}, {t, a, 81}, {text(12, 5), nullptr}}, 24);
    plain = alone(r);
    ASSERT_FALSE(plain.empty());
    if (t.back() == plain[0]) break;
    t.back() = plain[0];
  }
  ASSERT_EQ(t.back(), plain[0]) << "no fixed point: choose other seeds";
  EXPECT_EQ(plain, reference(r));
  SpeculationOptions spec;
  spec.source = DraftSource::Ngram, spec.adaptive = false;
  spec.ngram.n_min = 1;
  r.speculation = spec;
  EXPECT_EQ(alone(r), plain);
  // Penalties over a history of row ids (out of the vocabulary) leave them alone.
  Request p = image_request({{t, a, 81}, {t, nullptr}}, 16);
  p.sampling.temperature = 0.8f, p.sampling.seed = 3;
  p.sampling.presence_penalty = 1.5f, p.sampling.repetition_penalty = 1.3f;
  p.sampling.penalty_last_n = -1;
  EXPECT_EQ(alone(p).size(), 16u);
}

TEST(ImagePrompt, MalformedInputsAreRefusedByName) {
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok()) << e.message();
  const auto a = random_image(10, 5);
  const Request good = image_request({{text(10, 4), a, 1}, {text(11, 3), nullptr}}, 4);
  auto refused = [&](Request r) {
    auto id = (*e)->submit(std::move(r), [](const Event &) {});
    return id.ok() ? std::string() : id.message();
  };
  EXPECT_EQ(refused(good), "");
  Request r = good;
  r.prompt_logprobs = true;
  EXPECT_NE(refused(r).find("prompt_logprobs"), std::string::npos);
  r = good;
  SpeculationOptions spec;
  spec.source = DraftSource::Draft;
  r.speculation = spec;
  EXPECT_NE(refused(r).find("draft model"), std::string::npos);
  r = good;
  auto narrow = std::make_shared<model::EncodedImage>(*a);
  narrow->width = 32, narrow->rows.resize(5 * 32);
  r.embeddings[0].rows = narrow;
  EXPECT_NE(refused(r).find("width (64)"), std::string::npos);
  r = good;
  r.embeddings.push_back({r.embeddings[0].at + 2, a}); // overlapping
  EXPECT_NE(refused(r).find("disjoint"), std::string::npos);
  r = good;
  r.embeddings[0].at = int32_t(r.prompt.size()) - 2; // past the prompt's end
  EXPECT_NE(refused(r).find("inside the prompt"), std::string::npos);
  r = good;
  r.embeddings.clear(); // the row ids are then tokens, outside the vocabulary
  EXPECT_NE(refused(r).find("outside the vocabulary"), std::string::npos);
}

} // namespace
} // namespace offgraph::engine::testing
