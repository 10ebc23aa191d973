// engine/images: bytes to rows equal the pipeline run by hand (decode, grid, Lanczos, normalise,
// encoder); the same bytes again come from the cache (the same rows, no encoding), least recently
// used dropped past the budget; oversize, empty and undecodable bytes are refused by name; the
// digest is SHA-256 (a published vector); place_images puts each image's rows at its marker with
// image_row_ids of its digest and moves the message starts after it.
#include "engine/images.h"
#include "image/preprocess.h"
#include "model/vision_encoder.h"
#include "synth/mmproj.h"

#include "../image/random_png.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>
#include <unistd.h>

namespace offgraph::engine {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

struct Vision {
  std::string path;
  std::unique_ptr<model::VisionModel> model;
  Vision() {
    path = (fs::temp_directory_path() / ("offgraph-images-" + std::to_string(getpid()) + ".gguf"))
               .string();
    synth::MmprojSpec s;
    s.n_layer = 2, s.seed = 5;
    EXPECT_TRUE(synth::write_mmproj(s, path).ok());
    model = std::move(model::VisionModel::load(path, 64)).value();
  }
  ~Vision() { fs::remove(path); }
};
Vision &vision() {
  static Vision v;
  return v;
}

Bytes png(int w, int h, uint64_t seed) { return offgraph::testing::random_png(w, h, seed); }

TEST(Images, DigestIsSha256) {
  const std::string abc = "abc";
  const ImageDigest d = image_digest({reinterpret_cast<const uint8_t *>(abc.data()), abc.size()});
  const uint8_t want[4] = {0xba, 0x78, 0x16, 0xbf}; // FIPS 180-2's "abc": ba7816bf 8f01cfea ...
  EXPECT_TRUE(std::equal(want, want + 4, d.begin()));
  EXPECT_EQ(d[31], 0xad);
}

TEST(Images, EncodeEqualsThePipelineByHandAndCaches) {
  const model::VisionModel &vm = *vision().model;
  ImageEncoder enc(vm, {});
  const Bytes a = png(100, 70, 1);
  auto p = enc.encode(a);
  ASSERT_TRUE(p.ok()) << p.message();
  auto img = image::decode_image(a);
  ASSERT_TRUE(img.ok());
  const model::VisionConfig &c = vm.config();
  const image::GridSize g = image::choose_grid(100, 70, 28, c.max_tokens);
  auto want = model::encode_image(
      vm,
      image::normalize_planar(image::resize_lanczos(*img, g.width, g.height), c.mean, c.std_dev),
      g.width, g.height, 2);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(p->rows->rows, want->rows);
  EXPECT_EQ(p->rows->n_rows, (g.width / 28) * (g.height / 28));
  EXPECT_EQ(p->width, 100);
  EXPECT_FALSE(p->from_cache);
  auto again = enc.encode(a);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->from_cache);
  EXPECT_EQ(again->rows.get(), p->rows.get());
  EXPECT_EQ(enc.stats().encoded, 1);
  EXPECT_EQ(enc.stats().cache_hits, 1);
  // Other bytes, other digest and rows.
  auto b = enc.encode(png(100, 70, 2));
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->digest, p->digest);
  EXPECT_NE(b->rows->rows, p->rows->rows);
}

// A client that hangs up while its image waits for its turn or is being encoded: the encode ends
// early, nothing is encoded or cached, the reserved room stays with the caller; the same bytes
// later encode in full. Between the layers the encoder asks `cancelled` (ggml's abort callback).
TEST(Images, ACancelledEncodeEndsEarlyAndKeepsNothing) {
  const model::VisionModel &vm = *vision().model;
  ImageEncoder enc(vm, {});
  const Bytes a = png(100, 70, 11);
  const ImageEncoder::Stats before = enc.stats();
  auto count = enc.count_rows(a);
  ASSERT_TRUE(count.ok());
  auto room = enc.reserve_rows(enc.rows_bytes(*count));
  ASSERT_TRUE(room.ok()) << room.message();
  const int64_t reserved = enc.stats().reserved_bytes;
  EXPECT_GT(reserved, 0);
  auto gone = enc.encode(a, &*room, [] { return true; });
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.message().find("cancelled"), std::string::npos) << gone.message();
  EXPECT_EQ(enc.stats().encoded, before.encoded);
  EXPECT_EQ(enc.stats().live_bytes, before.live_bytes);
  EXPECT_EQ(enc.stats().cached_bytes, before.cached_bytes);
  EXPECT_EQ(enc.stats().reserved_bytes, reserved); // the room stays with its holder
  EXPECT_EQ(room->bytes(), reserved);
  *room = ImageEncoder::Reservation();
  EXPECT_EQ(enc.stats().reserved_bytes, 0); // and goes with it
  auto p = enc.encode(a, nullptr, [] { return false; });
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_FALSE(p->from_cache);
  EXPECT_EQ(enc.stats().encoded, before.encoded + 1);

  // Mid-graph: the encoder asked between its nodes, stopped on the third question.
  auto img = image::decode_image(a);
  ASSERT_TRUE(img.ok());
  const model::VisionConfig &c = vm.config();
  const image::GridSize g = image::choose_grid(100, 70, 28, c.max_tokens);
  const std::vector<float> planar =
      image::normalize_planar(image::resize_lanczos(*img, g.width, g.height), c.mean, c.std_dev);
  int asked = 0;
  auto stopped =
      model::encode_image(vm, planar, g.width, g.height, 2, [&asked] { return ++asked >= 3; });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(asked, 3);
  EXPECT_NE(stopped.message().find("cancelled"), std::string::npos) << stopped.message();
  asked = 0;
  auto whole = model::encode_image(vm, planar, g.width, g.height, 2, [&asked] {
    ++asked;
    return false;
  });
  ASSERT_TRUE(whole.ok());
  EXPECT_GT(asked, 3); // asked between many nodes
  EXPECT_EQ(whole->rows, p->rows->rows);
}

// Memory that cannot be had while an image is encoded (ImageOptions::fault at each site: the
// decoded pixels, the encoder graph's buffers, the rows' holder) fails that encode alone with a
// kUnavailable error naming memory: nothing is encoded, counted alive or cached, the room stays
// with its holder, and the same bytes encode afterwards to the rows a clean encoder gives. An
// image whose cache entry cannot be had is served, not kept.
TEST(Images, AnEncodeWithoutItsMemoryFailsAloneAndKeepsNothing) {
  const model::VisionModel &vm = *vision().model;
  const Bytes a = png(100, 70, 11);
  ImageEncoder clean(vm, {});
  auto want = clean.encode(a);
  ASSERT_TRUE(want.ok()) << want.message();
  for (const char *site : {"decode", "graph", "rows"}) {
    SCOPED_TRACE(site);
    bool armed = true;
    ImageOptions o;
    o.fault = [&](std::string_view s) { return armed && s == site; };
    ImageEncoder enc(vm, o);
    auto room = enc.reserve_rows(enc.rows_bytes(want->rows->n_rows));
    ASSERT_TRUE(room.ok()) << room.message();
    const int64_t reserved = enc.stats().reserved_bytes;
    auto failed = enc.encode(a, &*room);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(failed.message().find("out of memory"), std::string::npos) << failed.message();
    const ImageEncoder::Stats after = enc.stats();
    EXPECT_EQ(after.encoded, 0);
    EXPECT_EQ(after.live_bytes, 0);
    EXPECT_EQ(after.cached_bytes, 0);
    EXPECT_EQ(after.reserved_bytes, reserved);
    EXPECT_EQ(room->bytes(), reserved);
    armed = false;
    auto again = enc.encode(a, &*room);
    ASSERT_TRUE(again.ok()) << again.message();
    EXPECT_FALSE(again->from_cache);
    EXPECT_EQ(again->rows->rows, want->rows->rows);
    EXPECT_EQ(enc.stats().reserved_bytes, 0); // taken by the rows
  }
  ImageOptions o;
  o.fault = [](std::string_view s) { return s == "cache"; };
  ImageEncoder enc(vm, o);
  {
    auto served = enc.encode(a);
    ASSERT_TRUE(served.ok()) << served.message();
    EXPECT_EQ(served->rows->rows, want->rows->rows);
    EXPECT_EQ(enc.stats().cached_bytes, 0);
    EXPECT_GT(enc.stats().live_bytes, 0);
    EXPECT_FALSE(enc.cached(served->digest));
  }
  EXPECT_EQ(enc.stats().live_bytes, 0); // its holder gone, nothing alive
}

TEST(Images, CacheDropsTheLeastRecentlyUsedPastItsBudget) {
  // Room for two images of 6 rows x 64 floats.
  ImageOptions two;
  two.cache_bytes = 2 * 6 * 64 * 4;
  ImageEncoder enc(*vision().model, two);
  const Bytes a = png(100, 70, 3), b = png(100, 70, 4), c = png(100, 70, 5);
  for (const Bytes *x : {&a, &b, &a, &c}) ASSERT_TRUE(enc.encode(*x).ok()); // b is oldest at c
  EXPECT_TRUE(enc.encode(a)->from_cache);
  EXPECT_TRUE(enc.encode(c)->from_cache);
  EXPECT_FALSE(enc.encode(b)->from_cache);
  EXPECT_EQ(enc.stats().cached_bytes, 2 * 6 * 64 * 4);
  ImageOptions zero;
  zero.cache_bytes = 0;
  ImageEncoder none(*vision().model, zero);
  ASSERT_TRUE(none.encode(a).ok());
  EXPECT_FALSE(none.encode(a)->from_cache);
}

// The image memory budget (ImageOptions::rows_budget): rows count as alive from their encode
// until the last holder drops them; a reservation past the budget alone is refused by name; one
// that does not fit waits (cached images give way first, then rows that requests drop), is
// refused when max_waiting others wait, and gives up after max_wait. Images of 6 rows x 64 f32.
TEST(Images, RowsStayWithinTheirBudget) {
  constexpr int64_t kImage = 6 * 64 * 4;
  const Bytes a = png(100, 70, 13), b = png(100, 70, 14), c = png(100, 70, 15);
  ImageOptions o;
  o.rows_budget = kImage + kImage / 2, o.cache_bytes = 0, o.max_wait = std::chrono::seconds(20);
  ImageEncoder enc(*vision().model, o);
  EXPECT_EQ(enc.rows_bytes(6), kImage);
  auto too_big = enc.reserve_rows(2 * kImage);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.message().find("--image-mib"), std::string::npos) << too_big.message();
  std::shared_ptr<const model::EncodedImage> held;
  {
    auto room = enc.reserve_rows(kImage);
    ASSERT_TRUE(room.ok()) << room.message();
    EXPECT_EQ(enc.stats().reserved_bytes, kImage);
    auto p = enc.encode(a, &*room);
    ASSERT_TRUE(p.ok()) << p.message();
    EXPECT_EQ(room->bytes(), 0);
    held = p->rows;
    EXPECT_EQ(enc.stats().live_bytes, kImage);
    EXPECT_EQ(enc.stats().reserved_bytes, 0);
  }
  // b waits while a's rows are held; dropping them lets it in.
  std::atomic<bool> b_done{false};
  std::thread waiter([&] {
    auto room = enc.reserve_rows(kImage);
    EXPECT_TRUE(room.ok()) << room.message();
    if (room.ok()) {
      EXPECT_TRUE(enc.encode(b, &*room).ok());
    }
    b_done = true;
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (enc.stats().waiting == 0 && !b_done && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(enc.stats().waiting, 1);
  EXPECT_FALSE(b_done);
  EXPECT_LE(enc.stats().live_bytes + enc.stats().reserved_bytes, o.rows_budget);
  held.reset();
  waiter.join();
  EXPECT_TRUE(b_done);
  EXPECT_EQ(enc.stats().live_bytes, 0); // b's rows went with the thread (nothing cached)
  // None may wait: refused at once (429); a short wait: refused after it (503).
  ImageOptions strict = o;
  strict.max_waiting = 0;
  ImageEncoder queue_full(*vision().model, strict);
  held = queue_full.encode(c).value().rows; // a command's own image: not held to the budget
  auto refused = queue_full.reserve_rows(kImage);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  strict.max_waiting = 1, strict.max_wait = std::chrono::milliseconds(50);
  ImageEncoder impatient(*vision().model, strict);
  auto kept = impatient.encode(c).value().rows;
  auto timed_out = impatient.reserve_rows(kImage);
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(impatient.stats().refused, 1);
  auto stopped = impatient.reserve_rows(kImage, [] { return true; });
  EXPECT_EQ(stopped.status().code(), StatusCode::kUnavailable);
  // A cached image nobody holds gives way at once.
  ImageOptions cached = o;
  cached.cache_bytes = int64_t(1) << 20;
  ImageEncoder with_cache(*vision().model, cached);
  ASSERT_TRUE(with_cache.encode(a).ok());
  EXPECT_EQ(with_cache.stats().cached_bytes, kImage);
  auto room = with_cache.reserve_rows(kImage);
  ASSERT_TRUE(room.ok()) << room.message();
  EXPECT_EQ(with_cache.stats().cached_bytes, 0);
  EXPECT_EQ(with_cache.stats().live_bytes, 0);
}

// count_rows: what encode will make, before it (sizes that round either way, a long thin one, one
// under a cell), without encoding or touching the cache; then from the cache; the same refusals.
TEST(Images, CountRowsIsWhatEncodeMakes) {
  ImageEncoder enc(*vision().model, {});
  const std::pair<int, int> sizes[] = {{100, 70}, {300, 901}, {57, 29}, {640, 480}, {20, 20}};
  uint64_t seed = 40;
  for (auto [w, h] : sizes) {
    const Bytes b = png(w, h, ++seed);
    auto counted = enc.count_rows(b);
    ASSERT_TRUE(counted.ok()) << counted.message();
    EXPECT_EQ(enc.stats().encoded, int64_t(seed - 41)) << "count_rows encoded";
    auto encoded = enc.encode(b);
    ASSERT_TRUE(encoded.ok());
    EXPECT_FALSE(encoded->from_cache) << "count_rows filled the cache";
    EXPECT_EQ(*counted, encoded->rows->n_rows) << w << "x" << h;
    EXPECT_EQ(enc.count_rows(b).value(), encoded->rows->n_rows) << "from the cache";
  }
  EXPECT_EQ(enc.stats().cache_hits, 0);
  EXPECT_NE(enc.count_rows(Bytes{}).message().find("empty"), std::string::npos);
  const Bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  EXPECT_FALSE(enc.count_rows(text).ok());
}

TEST(Images, BadBytesAreRefusedByName) {
  ImageOptions tight;
  tight.max_bytes = 1000;
  ImageEncoder enc(*vision().model, tight);
  const Bytes big = png(100, 70, 6);
  ASSERT_GT(big.size(), 1000u);
  auto r = enc.encode(big);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("at most 1000"), std::string::npos) << r.message();
  EXPECT_NE(enc.encode(Bytes{}).message().find("empty"), std::string::npos);
  const Bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  EXPECT_FALSE(enc.encode(text).ok());
  ImageOptions few;
  few.decode.max_pixels = 1000;
  ImageEncoder small(*vision().model, few);
  auto huge = small.encode(big);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.message().find("100x70"), std::string::npos) << huge.message();
}

TEST(Images, PlaceImagesAtTheirMarkers) {
  auto rows = [](int32_t n) {
    auto e = std::make_shared<model::EncodedImage>();
    e->n_rows = n, e->width = 4, e->rows.assign(size_t(n) * 4, 0.5f);
    return e;
  };
  PreparedImage a, b;
  a.digest[0] = 1, a.rows = rows(3);
  b.digest[0] = 2, b.rows = rows(2);
  const ImageMarkers m{9, 7, 8};
  std::vector<int32_t> prompt = {1, 9, 2, 3, 9, 4}, starts = {0, 2, 5};
  const PreparedImage both[] = {a, b};
  auto placed = place_images(prompt, starts, m, both, 100);
  ASSERT_TRUE(placed.ok()) << placed.message();
  const auto ia = image_row_ids(a.digest, 3, 100), ib = image_row_ids(b.digest, 2, 100);
  const std::vector<int32_t> want = {1, 7, ia[0], ia[1], ia[2], 8, 2, 3, 7, ib[0], ib[1], 8, 4};
  EXPECT_EQ(prompt, want);
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 6, 12}));
  ASSERT_EQ(placed->size(), 2u);
  EXPECT_EQ((*placed)[0].at, 2);
  EXPECT_EQ((*placed)[1].at, 9);
  for (int32_t id : ia) EXPECT_GE(id, 100);
  EXPECT_NE(ia, image_row_ids(b.digest, 3, 100));
  // Every byte of the digest names the rows: digests that differ past the first 8 bytes (where
  // 64 bits of them named the rows before) give other ids, row by row; 9+ rows (two SHA-256
  // blocks of draws) too.
  PreparedImage c = a;
  c.digest[31] ^= 1;
  const auto ic = image_row_ids(c.digest, 20, 100), ia20 = image_row_ids(a.digest, 20, 100);
  for (size_t i = 0; i < ic.size(); ++i) EXPECT_NE(ic[i], ia20[i]) << i;
  EXPECT_EQ(std::vector<int32_t>(ia20.begin(), ia20.begin() + 3), ia); // a prefix: the same draws
  std::vector<int32_t> one = {9, 1}, none;
  auto r = place_images(one, none, m, both, 100);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("1 image places and the request 2 images"), std::string::npos);
}

} // namespace
} // namespace offgraph::engine
