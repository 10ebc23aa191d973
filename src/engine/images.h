// Images into prompts: bytes (PNG, JPEG) to the text model's embedding rows through the vision
// encoder, with the encoded rows kept by content for images sent again; and their place in a
// prompt. What `serve`, `run`, `chat` and `logits` share.
//
// An image part is <|image_start|>, the image's rows, <|image_end|> at consecutive positions
// (mtmd's layout for this projector; the chat template writes one <|patch|> per part, which is
// replaced). The rows' ids are image_row_ids of the image's SHA-256: the prefix tree reuses an
// image's rows only when the same bytes are sent again. The ids come from the whole digest (31
// bits a row, drawn by SHA-256 again): two images whose rows share ids are two images whose
// digests collide, or, for an image of fewer than 9 rows, whose 31 bits a row do.
#pragma once

#include "engine/engine.h"
#include "image/decode.h"
#include "image/preprocess.h"
#include "model/vision.h"

#include <array>
#include <chrono>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace offgraph::engine {

struct ImageOptions {
  int64_t max_bytes = int64_t(20) << 20; // one image's PNG/JPEG bytes
  image::DecodeLimits decode;            // its decoded size
  // Encoded rows kept for images sent again, least recently used dropped past this (0: none).
  int64_t cache_bytes = int64_t(256) << 20;
  // Encoded rows alive at once (docs/reliability.md, "Budgets"): in the cache, in the requests
  // that hold them (queued or active) and reserved for encodes to come. A request's images are
  // reserved together before any is encoded (reserve_rows), so that two requests never each hold
  // part of what they need; cached images give way first. 0: no limit.
  int64_t rows_budget = int64_t(1024) << 20;
  // Requests waiting for room at once; one more is refused (kResourceExhausted).
  int32_t max_waiting = 16;
  // How long one waits for room before it is refused (kUnavailable).
  std::chrono::milliseconds max_wait{std::chrono::seconds(120)};
  int threads = 2;
  // Fault injection for tests: true at a site fails it as if its memory could not be had:
  // "decode" (the decoded pixels: std::bad_alloc), "graph" (the encoder graph's buffers),
  // "rows" (the encoded rows' holder: std::bad_alloc), "cache" (the cache's entry:
  // std::bad_alloc; the image is still served, not kept).
  std::function<bool(std::string_view site)> fault;
};

using ImageDigest = std::array<uint8_t, 32>; // SHA-256

// SHA-256 of `bytes` (OpenSSL).
ImageDigest image_digest(std::span<const uint8_t> bytes);

struct PreparedImage {
  ImageDigest digest{};
  std::shared_ptr<const model::EncodedImage> rows;
  int32_t width = 0, height = 0;           // as decoded
  int32_t grid_width = 0, grid_height = 0; // resized to (pixels)
  bool from_cache = false;
};

// The ids of an image's n_rows embedding rows in a prompt, drawn from its whole digest into
// [n_vocab, INT32_MAX]: row i's from bytes 4 (i % 8) of SHA-256(digest, i / 8), so that the prefix
// tree tells images apart by them.
std::vector<int32_t> image_row_ids(const ImageDigest &digest, int32_t n_rows, int32_t n_vocab);

class ImageEncoder {
  struct RowTally; // the rows alive and reserved, shared with the rows' deleters

public:
  static constexpr std::chrono::milliseconds kCancelPoll{20};

  ImageEncoder(const model::VisionModel &vision, ImageOptions options);

  // Room for encoded rows, held until it goes (reserve_rows); what encode() makes under it moves
  // from reserved to alive.
  class Reservation {
  public:
    Reservation() = default;
    Reservation(Reservation &&other) noexcept;
    Reservation &operator=(Reservation &&other) noexcept;
    ~Reservation();
    int64_t bytes() const { return bytes_; }

  private:
    friend class ImageEncoder;
    std::shared_ptr<RowTally> tally_;
    int64_t bytes_ = 0;
  };

  // The bytes of `n_rows` encoded rows (the text model's width, f32).
  int64_t rows_bytes(int32_t n_rows) const;
  // Room for `bytes` of encoded rows (a request's images, counted before encoding: count_rows,
  // rows_bytes): waits while the rows alive and reserved leave too little, dropping cached
  // images (least recently used first). Refused, naming the limit: `bytes` past rows_budget
  // alone (kInvalidArgument), max_waiting requests already waiting (kResourceExhausted), no room
  // after max_wait (kUnavailable), or `cancelled` returning true while it waits (kUnavailable:
  // the server stopping).
  Result<Reservation> reserve_rows(int64_t bytes, const std::function<bool()> &cancelled = {});

  // Bytes to rows: decoded, resized to the grid the reference chooses, normalised as the file
  // says, encoded. Thread-safe; one image is encoded at a time (it takes every thread). The same
  // bytes again come from the cache. Errors name the problem (size, format, dimensions). The
  // rows it makes count as alive until the last holder drops them; taken out of `room` where
  // given, which must come from this encoder's reserve_rows (a caller without one, a command's
  // own images, is not held to rows_budget). `cancelled` (a client that hung up, a server
  // stopping) is asked while it waits for its turn and between the encoder graph's nodes, every
  // kCancelPoll at most: true ends it with kUnavailable, nothing encoded or cached. Memory that
  // cannot be had (host or the encoder graph's) ends it with kUnavailable naming it, nothing
  // kept but what `room` held; an image that cannot be cached is served without.
  Result<PreparedImage> encode(std::span<const uint8_t> bytes, Reservation *room = nullptr,
                               const std::function<bool()> &cancelled = {});

  // The image of `digest` (image_digest of its bytes) if the cache holds it (counted as a hit,
  // moved to the front); holding its rows keeps them alive whatever the cache drops later.
  std::optional<PreparedImage> cached(const ImageDigest &digest);

  // The rows `bytes` encode to, without encoding: from the cache, or decoded and sized (a
  // fraction of a percent of the encode). What a caller checks against the context before
  // paying for encode. The same errors as encode.
  Result<int32_t> count_rows(std::span<const uint8_t> bytes);

  struct Stats {
    int64_t encoded = 0, cache_hits = 0, rows = 0; // rows: of the images encoded
    double seconds = 0;                            // encoding them (decode included)
    int64_t cached_bytes = 0;
    // Against rows_budget: rows alive (cached or held by requests) and reserved; requests
    // waiting for room now, and those refused for it so far.
    int64_t live_bytes = 0, reserved_bytes = 0;
    int32_t waiting = 0;
    int64_t refused = 0;
  };
  Stats stats() const;
  const ImageOptions &options() const { return options_; }
  const model::VisionModel &vision() const { return vision_; }

private:
  Status check_size(std::span<const uint8_t> bytes) const;
  // encode() past its turn in line: decoded, encoded, counted, cached. Throws std::bad_alloc
  // with every count as before it (encode() turns it into an error).
  Result<PreparedImage> encode_holding_turn(std::span<const uint8_t> bytes,
                                            const ImageDigest &digest, Reservation *room,
                                            const std::function<bool()> &cancel_between);
  // Keeps `p` for the same bytes again (under mutex_), dropping the least recently used past
  // cache_bytes; not kept where the entry's memory cannot be had.
  void cache_image(const ImageDigest &digest, const PreparedImage &p, int64_t size,
                   std::vector<std::shared_ptr<const model::EncodedImage>> &dropped);
  bool injected(std::string_view site) const { return options_.fault && options_.fault(site); }
  image::GridSize grid_for(const image::Image &decoded) const; // pixels, whole cells
  // The cached image of `key`, or none; a hit moves it to the front and is counted.
  std::optional<PreparedImage> lookup(const std::string &key);

  // Drops the least recently used cached image that no request holds (dropping it frees its
  // rows); false when there is none.
  bool drop_cached_image();

  const model::VisionModel &vision_;
  ImageOptions options_;
  std::shared_ptr<RowTally> tally_;
  mutable std::mutex mutex_;      // the cache and the stats
  std::timed_mutex encode_mutex_; // one encoding at a time
  using Entry = std::pair<std::string, PreparedImage>;
  std::list<Entry> lru_; // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_digest_;
  Stats stats_;
};

// The tokens an image part is written with in the model's vocabulary.
struct ImageMarkers {
  int32_t marker = -1; // what the chat template writes for an image part (<|patch|>)
  int32_t begin = -1;  // <|image_start|>
  int32_t end = -1;    // <|image_end|>
};

// Each marker id in `prompt`, in order, becomes begin, the image's rows (ids: image_row_ids of
// its hash), end; `message_starts` after a marker move with it. Returns the embeddings for
// Request::embeddings; an error when the markers and the images differ in number.
Result<std::vector<Request::Embeddings>>
place_images(std::vector<int32_t> &prompt, std::vector<int32_t> &message_starts,
             const ImageMarkers &markers, std::span<const PreparedImage> images, int32_t n_vocab);

} // namespace offgraph::engine
