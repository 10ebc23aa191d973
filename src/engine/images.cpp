#include "engine/images.h"

#include "base/units.h"

#include "image/preprocess.h"
#include "model/vision_encoder.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

namespace offgraph::engine {

ImageDigest image_digest(std::span<const uint8_t> bytes) {
  ImageDigest d{};
  unsigned int n = 0;
  // One-shot EVP digest: fails only on allocation failure, where a zero digest would alias every
  // image; abort instead of keying rows by it.
  if (EVP_Digest(bytes.data(), bytes.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 ||
      n != d.size())
    std::abort();
  return d;
}

std::vector<int32_t> image_row_ids(const ImageDigest &digest, int32_t n_rows, int32_t n_vocab) {
  const uint64_t range = uint64_t(std::numeric_limits<int32_t>::max()) - uint64_t(n_vocab) + 1;
  std::vector<int32_t> ids(size_t(std::max(0, n_rows)));
  ImageDigest block{};
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 8 == 0) { // SHA-256(digest, the block's index as 8 little-endian bytes)
      std::array<uint8_t, 40> input{};
      std::memcpy(input.data(), digest.data(), digest.size());
      for (int b = 0; b < 8; ++b) input[32 + size_t(b)] = uint8_t(uint64_t(i / 8) >> (8 * b));
      block = image_digest(input);
    }
    uint32_t draw = 0;
    std::memcpy(&draw, block.data() + 4 * (i % 8), 4);
    ids[i] = n_vocab + int32_t(uint64_t(draw) % range);
  }
  return ids;
}
// Shared with the deleters of the rows handed out, which may outlive the encoder.
struct ImageEncoder::RowTally {
  std::mutex mutex;
  std::condition_variable room; // rows dropped, a reservation gone
  int64_t live = 0, reserved = 0, refused = 0;
  int32_t waiting = 0;
  void release(int64_t live_bytes, int64_t reserved_bytes) {
    {
      std::lock_guard lock(mutex);
      live -= live_bytes, reserved -= reserved_bytes;
    }
    room.notify_all();
  }
};

ImageEncoder::Reservation::Reservation(Reservation &&other) noexcept
    : tally_(std::move(other.tally_)), bytes_(std::exchange(other.bytes_, 0)) {}

ImageEncoder::Reservation &ImageEncoder::Reservation::operator=(Reservation &&other) noexcept {
  if (this != &other) {
    if (tally_) tally_->release(0, bytes_);
    tally_ = std::move(other.tally_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ImageEncoder::Reservation::~Reservation() {
  if (tally_) tally_->release(0, bytes_);
}

ImageEncoder::ImageEncoder(const model::VisionModel &vision, ImageOptions options)
    : vision_(vision), options_(options), tally_(std::make_shared<RowTally>()) {}

ImageEncoder::Stats ImageEncoder::stats() const {
  Stats s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  std::lock_guard lock(tally_->mutex);
  s.live_bytes = tally_->live, s.reserved_bytes = tally_->reserved;
  s.waiting = tally_->waiting, s.refused = tally_->refused;
  return s;
}

int64_t ImageEncoder::rows_bytes(int32_t n_rows) const {
  return int64_t(n_rows) * vision_.config().n_embd_out * int64_t(sizeof(float));
}

bool ImageEncoder::drop_cached_image() {
  std::shared_ptr<const model::EncodedImage> dropped; // its deleter runs outside the lock
  std::lock_guard lock(mutex_);
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (it->second.rows.use_count() != 1) continue; // a request holds it: dropping frees nothing
    stats_.cached_bytes -= int64_t(it->second.rows->rows.size() * sizeof(float));
    dropped = std::move(it->second.rows);
    by_digest_.erase(it->first);
    lru_.erase(std::next(it).base());
    return true;
  }
  return false;
}

std::optional<PreparedImage> ImageEncoder::cached(const ImageDigest &digest) {
  return lookup(std::string(digest.begin(), digest.end()));
}

Result<ImageEncoder::Reservation>
ImageEncoder::reserve_rows(int64_t bytes, const std::function<bool()> &cancelled) {
  const int64_t budget = options_.rows_budget;
  RowTally &t = *tally_;
  auto refuse = [&](Status s) {
    std::lock_guard lock(t.mutex);
    ++t.refused;
    return s;
  };
  if (budget > 0 && bytes > budget)
    return refuse(Status::error("the images' rows take " + mib(bytes) +
                                "; the image memory budget (--image-mib) is " + mib(budget)));
  const auto deadline = std::chrono::steady_clock::now() + options_.max_wait;
  std::unique_lock lock(t.mutex);
  auto fits = [&] { return budget <= 0 || t.live + t.reserved + bytes <= budget; };
  if (!fits()) {
    if (t.waiting >= options_.max_waiting) {
      lock.unlock();
      return refuse(Status::error(std::to_string(options_.max_waiting) +
                                      " requests already wait for image memory (--image-mib " +
                                      mib(budget) + ")",
                                  StatusCode::kResourceExhausted));
    }
    ++t.waiting;
    while (!fits()) {
      // Cached images give way first; then the rows requests hold, as they finish.
      lock.unlock();
      const bool dropped = drop_cached_image();
      lock.lock();
      if (dropped || fits()) continue;
      lock.unlock(); // the callback may look at this encoder
      const bool gone = cancelled && cancelled();
      lock.lock();
      if (gone) {
        --t.waiting, ++t.refused;
        return Status::error("cancelled while waiting for image memory (the client left or the "
                             "server stops)",
                             StatusCode::kUnavailable);
      }
      if (fits()) continue;
      // Woken by rows dropped or a reservation gone; a short period for `cancelled`.
      const auto wake =
          std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      if (t.room.wait_until(lock, wake) == std::cv_status::timeout && !fits() &&
          std::chrono::steady_clock::now() >= deadline) {
        --t.waiting, ++t.refused;
        return Status::error("no image memory came free in " +
                                 std::to_string(options_.max_wait.count()) + " ms (--image-mib " +
                                 mib(budget) + ")",
                             StatusCode::kUnavailable);
      }
    }
    --t.waiting;
  }
  t.reserved += bytes;
  Reservation r;
  r.tally_ = tally_;
  r.bytes_ = bytes;
  return r;
}

Status ImageEncoder::check_size(std::span<const uint8_t> bytes) const {
  if (bytes.empty()) return Status::error("the image is empty (0 bytes)");
  if (int64_t(bytes.size()) > options_.max_bytes)
    return Status::error("the image has " + std::to_string(bytes.size()) + " bytes; at most " +
                         std::to_string(options_.max_bytes) + " are accepted");
  return Status{};
}

image::GridSize ImageEncoder::grid_for(const image::Image &decoded) const {
  const model::VisionConfig &c = vision_.config();
  return image::choose_grid(decoded.width, decoded.height, c.patch * c.merge, c.max_tokens);
}

std::optional<PreparedImage> ImageEncoder::lookup(const std::string &key) {
  std::lock_guard lock(mutex_);
  auto it = by_digest_.find(key);
  if (it == by_digest_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.cache_hits;
  PreparedImage p = it->second->second;
  p.from_cache = true;
  return p;
}

Result<int32_t> ImageEncoder::count_rows(std::span<const uint8_t> bytes) {
  if (Status s = check_size(bytes); !s.ok()) return s;
  const ImageDigest digest = image_digest(bytes);
  {
    std::lock_guard lock(mutex_); // a look, not a use: neither the order nor the hit count
    auto it = by_digest_.find(std::string(digest.begin(), digest.end()));
    if (it != by_digest_.end()) return it->second->second.rows->n_rows;
  }
  auto decoded = image::decode_image(bytes, options_.decode);
  if (!decoded.ok()) return decoded.status();
  const image::GridSize g = grid_for(*decoded);
  const int32_t cell = vision_.config().patch * vision_.config().merge;
  return (g.width / cell) * (g.height / cell);
}

Result<PreparedImage> ImageEncoder::encode(std::span<const uint8_t> bytes, Reservation *room,
                                           const std::function<bool()> &cancelled) {
  if (Status s = check_size(bytes); !s.ok()) return s;
  if (room && room->tally_ && room->tally_ != tally_)
    return Status::error("image encoder: a reservation of another encoder", StatusCode::kInternal);
  const ImageDigest digest = image_digest(bytes);
  const std::string key(digest.begin(), digest.end());
  if (auto hit = lookup(key)) return *hit;
  const Status gone = Status::error("image encoder: cancelled before the image was encoded",
                                    StatusCode::kUnavailable);
  // Its turn: one encode at a time (it takes every thread), the others wait here; one whose
  // caller is gone meanwhile leaves the line without encoding.
  std::unique_lock encoding(encode_mutex_, std::defer_lock);
  while (!encoding.try_lock_for(kCancelPoll))
    if (cancelled && cancelled()) return gone;
  if (auto hit = lookup(key)) return *hit; // encoded by another caller meanwhile
  if (cancelled && cancelled()) return gone;
  // Asked between the encoder graph's nodes, at most every kCancelPoll.
  std::function<bool()> cancel_between;
  if (cancelled)
    cancel_between = [&cancelled, next = std::chrono::steady_clock::now() + kCancelPoll]() mutable {
      const auto now = std::chrono::steady_clock::now();
      if (now < next) return false;
      next = now + kCancelPoll;
      return cancelled();
    };
  try {
    return encode_holding_turn(bytes, digest, room, cancel_between);
  } catch (const std::bad_alloc &) {
    // Thrown with every count as it was: this request fails, the server goes on.
    return Status::error("image encoder: out of memory while decoding or encoding the image",
                         StatusCode::kUnavailable);
  }
}

Result<PreparedImage>
ImageEncoder::encode_holding_turn(std::span<const uint8_t> bytes, const ImageDigest &digest,
                                  Reservation *room, const std::function<bool()> &cancel_between) {
  const auto t0 = std::chrono::steady_clock::now();
  if (injected("decode")) throw std::bad_alloc();
  auto decoded = image::decode_image(bytes, options_.decode);
  if (!decoded.ok()) return decoded.status();
  const model::VisionConfig &c = vision_.config();
  PreparedImage p;
  p.digest = digest;
  p.width = decoded->width, p.height = decoded->height;
  const image::GridSize g = grid_for(*decoded);
  p.grid_width = g.width, p.grid_height = g.height;
  const image::Image resized = image::resize_lanczos(*decoded, g.width, g.height);
  decoded->rgb = {}; // the full-size pixels are not needed past here
  auto rows = model::encode_image(vision_, image::normalize_planar(resized, c.mean, c.std_dev),
                                  g.width, g.height, options_.threads, cancel_between,
                                  [this] { return injected("graph"); });
  if (!rows.ok()) return rows.status();
  const int64_t size = int64_t(rows->rows.size() * sizeof(float));
  // The holder first: a throw past here leaves no count changed.
  if (injected("rows")) throw std::bad_alloc();
  auto held = std::make_unique<model::EncodedImage>(std::move(rows).value());
  int64_t taken = 0;
  {
    // Alive from here until the last holder drops them; out of the room reserved for them.
    std::lock_guard lock(tally_->mutex);
    taken = room ? std::min(room->bytes_, size) : 0;
    if (room) room->bytes_ -= taken;
    tally_->reserved -= taken, tally_->live += size;
  }
  try {
    p.rows = std::shared_ptr<const model::EncodedImage>(
        held.release(), [tally = tally_, size](const model::EncodedImage *e) {
          delete e;
          tally->release(size, 0);
        });
  } catch (const std::bad_alloc &) {
    // The shared pointer's own block: it ran the deleter (the rows are no longer alive); the
    // room goes back to its holder.
    std::lock_guard lock(tally_->mutex);
    if (room) room->bytes_ += taken;
    tally_->reserved += taken;
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::shared_ptr<const model::EncodedImage>> dropped; // deleted outside the lock
  std::lock_guard lock(mutex_);
  ++stats_.encoded;
  stats_.rows += p.rows->n_rows;
  stats_.seconds += seconds;
  if (size <= options_.cache_bytes) cache_image(digest, p, size, dropped);
  return p;
}

void ImageEncoder::cache_image(const ImageDigest &digest, const PreparedImage &p, int64_t size,
                               std::vector<std::shared_ptr<const model::EncodedImage>> &dropped) {
  try {
    if (injected("cache")) throw std::bad_alloc();
    dropped.reserve(lru_.size() + 1); // the evictions below then allocate nothing
    lru_.emplace_front(std::string(digest.begin(), digest.end()), p);
  } catch (const std::bad_alloc &) {
    return; // served, not kept
  }
  try {
    by_digest_[lru_.front().first] = lru_.begin();
  } catch (const std::bad_alloc &) {
    lru_.pop_front();
    return;
  }
  stats_.cached_bytes += size;
  while (stats_.cached_bytes > options_.cache_bytes) {
    const Entry &last = lru_.back();
    stats_.cached_bytes -= int64_t(last.second.rows->rows.size() * sizeof(float));
    dropped.push_back(last.second.rows);
    by_digest_.erase(last.first);
    lru_.pop_back();
  }
}

Result<std::vector<Request::Embeddings>>
place_images(std::vector<int32_t> &prompt, std::vector<int32_t> &message_starts,
             const ImageMarkers &markers, std::span<const PreparedImage> images, int32_t n_vocab) {
  size_t n_markers = 0;
  for (int32_t t : prompt) n_markers += t == markers.marker;
  if (n_markers != images.size())
    return Status::error("the prompt has " + std::to_string(n_markers) +
                         " image places and the request " + std::to_string(images.size()) +
                         " images");
  if (images.empty()) return std::vector<Request::Embeddings>{};
  std::vector<int32_t> out;
  std::vector<Request::Embeddings> placed;
  std::vector<int32_t> moved = message_starts;
  size_t next = 0, start = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    // Message starts at or after position i move by what has been inserted so far.
    while (start < message_starts.size() && size_t(message_starts[start]) <= i)
      moved[start] = message_starts[start] + int32_t(out.size() - i), ++start;
    if (prompt[i] != markers.marker) {
      out.push_back(prompt[i]);
      continue;
    }
    const PreparedImage &img = images[next++];
    out.push_back(markers.begin);
    placed.push_back({int32_t(out.size()), img.rows});
    const std::vector<int32_t> ids = image_row_ids(img.digest, img.rows->n_rows, n_vocab);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(markers.end);
  }
  for (; start < message_starts.size(); ++start)
    moved[start] = message_starts[start] + int32_t(out.size() - prompt.size());
  prompt = std::move(out);
  message_starts = std::move(moved);
  return placed;
}

} // namespace offgraph::engine
