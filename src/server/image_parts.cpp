#include "server/image_parts.h"

#include <array>
#include <cctype>
#include <map>
#include <set>

namespace offgraph::server {
namespace {

// White space MIME puts between base64 lines (RFC 2045 wraps at 76 columns), and what browsers'
// atob also skips.
bool base64_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }

ApiError bad(const std::string &param, const std::string &message,
             const std::string &code = "invalid_value") {
  return ApiError{400, message, param, code};
}

} // namespace

Result<std::vector<uint8_t>> decode_base64(std::string_view text) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v;
    v.fill(-1);
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[uint8_t(alphabet[i])] = int8_t(i);
    return v;
  }();

  // The digits, without the white space MIME puts between lines (RFC 2045 wraps at 76 columns).
  std::string digits;
  digits.reserve(text.size());
  size_t pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (base64_space(c)) continue;
    if (c == '=') {
      if (++pad > 2) return Status::error("more than two '=' of padding");
      continue;
    }
    if (pad > 0)
      return Status::error("'" + std::string(1, c) + "' at byte " + std::to_string(i) +
                           " comes after the '=' padding");
    if (value[uint8_t(c)] < 0)
      return Status::error("byte " + std::to_string(i) + " (" +
                           (uint8_t(c) >= 0x20 && uint8_t(c) < 0x7f
                                ? "'" + std::string(1, c) + "'"
                                : "0x" + std::string(1, "0123456789abcdef"[uint8_t(c) >> 4]) +
                                      std::string(1, "0123456789abcdef"[uint8_t(c) & 15])) +
                           ") is not a base64 digit (A-Z, a-z, 0-9, '+', '/')");
    digits.push_back(c);
  }
  const size_t n = digits.size();
  if (pad > 0 && (n + pad) % 4 != 0)
    return Status::error("the '=' padding does not complete a group of four digits");
  if (n % 4 == 1)
    return Status::error("it ends with a lone digit (" + std::to_string(n) +
                         " digits: no whole byte in the last one)");
  std::vector<uint8_t> out;
  out.reserve(n / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : digits) {
    acc = (acc << 6) | uint32_t(value[uint8_t(c)]);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0)
    return Status::error("its last digit sets bits past the data (not canonical)");
  return out;
}

std::optional<ApiError> take_image_part(json &part, const std::string &where,
                                        const ModelFacts &facts,
                                        std::vector<std::vector<uint8_t>> *bytes) {
  const std::string param = where + ".image_url";
  if (!facts.images)
    return bad(param,
               "image input needs a vision projector: this server was started without --mmproj",
               "unsupported");
  for (auto it = part.begin(); it != part.end(); ++it)
    if (it.key() != "type" && it.key() != "image_url")
      return bad(where, where + " has '" + it.key() + "'; an image_url part holds only 'image_url'",
                 "unsupported");
  if (!part.contains("image_url")) return bad(param, where + " needs 'image_url'");
  json spec = part["image_url"];
  if (spec.is_string()) spec = json{{"url", spec}};
  if (!spec.is_object() || !spec.contains("url") || !spec["url"].is_string())
    return bad(param, param + " must be {\"url\": \"data:image/...;base64,...\"}", "invalid_type");
  for (auto it = spec.begin(); it != spec.end(); ++it)
    if (it.key() != "url" && it.key() != "detail")
      return bad(param, param + " has '" + it.key() + "', which is not supported", "unsupported");
  // "detail" chooses OpenAI's resolution tiers; this encoder has one (the model's grid).
  if (spec.contains("detail") && !spec["detail"].is_null() && spec["detail"] != "auto")
    return bad(param + ".detail",
               "'detail' " + spec["detail"].dump() +
                   " is not supported: images are encoded at the model's own resolution ('auto')",
               "unsupported");
  const std::string &url = spec["url"].get_ref<const std::string &>();
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0)
    return bad(param + ".url",
               "image URLs are not fetched (the server makes no network requests): send the "
               "image as a data: URI, data:image/png;base64,...",
               "unsupported");
  if (url.rfind("data:", 0) != 0)
    return bad(param + ".url", "an image url must be a data: URI (data:image/png;base64,...)");
  const size_t comma = url.find(',');
  if (comma == std::string::npos)
    return bad(param + ".url", "the data: URI has no ',' before its data");
  // RFC 2397: data:[<mediatype>][;<attribute>=<value>]*[;base64],<data>. Parameters (a charset,
  // a file name) say nothing about an image's bytes: accepted, and they change nothing.
  std::vector<std::string> head;
  for (size_t at = 5;;) {
    const size_t semi = url.find(';', at);
    if (semi == std::string::npos || semi > comma) {
      head.push_back(url.substr(at, comma - at));
      break;
    }
    head.push_back(url.substr(at, semi - at));
    at = semi + 1;
  }
  auto lower = [](std::string x) {
    for (char &c : x) c = char(std::tolower(uint8_t(c)));
    return x;
  };
  if (head.size() < 2 || lower(head.back()) != "base64")
    return bad(param + ".url", "the data: URI must be base64 (data:image/png;base64,...)");
  for (size_t k = 1; k + 1 < head.size(); ++k)
    if (head[k].find('=') == std::string::npos)
      return bad(param + ".url", "the data: URI's parameter '" + head[k] +
                                     "' is not attribute=value (data:image/png;base64,...)");
  const std::string type = lower(head[0]);
  if (!type.empty() && type != "image/png" && type != "image/jpeg" && type != "image/jpg")
    return bad(param + ".url",
               "the image type '" + head[0] + "' is not supported; send image/png or image/jpeg",
               "unsupported");
  const std::string_view data(url.data() + comma + 1, url.size() - comma - 1);
  const int64_t limit = facts.images->options().max_bytes;
  int64_t digits = 0; // before decoding it (MIME's line breaks are not data)
  for (char c : data) digits += !base64_space(c);
  if (digits / 4 * 3 > limit + 2)
    return bad(param + ".url", "the image has about " + std::to_string(digits / 4 * 3) +
                                   " bytes; at most " + std::to_string(limit) + " are accepted");
  auto decoded = decode_base64(data);
  if (!decoded.ok())
    return bad(param + ".url", "the data: URI's data is not valid base64: " + decoded.message());
  if (int64_t(decoded->size()) > limit)
    return bad(param + ".url", "the image has " + std::to_string(decoded->size()) +
                                   " bytes; at most " + std::to_string(limit) + " are accepted");
  if (bytes) {
    if (int32_t(bytes->size()) >= facts.max_images)
      return bad(param, "the request holds more than " + std::to_string(facts.max_images) +
                            " images, the most this server takes");
    bytes->push_back(std::move(*decoded));
  }
  part = json{{"type", "image"}};
  return std::nullopt;
}

std::optional<ApiError> attach_images(const ModelFacts &facts, Job &job,
                                      const std::function<bool()> &client_gone) {
  if (job.images.empty()) return std::nullopt;
  auto image_error = [&](size_t i, const Status &s) {
    ApiError e = api_error(s);
    e.param = job.image_params[i];
    e.message = job.image_params[i] + ": " + e.message;
    return e;
  };
  // The prompt's length once the images are in it, before any is encoded: a request that cannot
  // fit is refused for the price of decoding its images, not of encoding them (minutes each on
  // the real tower). Each image's marker becomes <|image_start|>, its rows, <|image_end|>.
  int64_t placed_length = int64_t(job.request.prompt.size());
  std::vector<int32_t> rows(job.images.size());
  for (size_t i = 0; i < job.images.size(); ++i) {
    auto counted = facts.images->count_rows(job.images[i]);
    if (!counted.ok()) return image_error(i, counted.status());
    rows[i] = *counted;
    placed_length += int64_t(*counted) + 1;
  }
  if (auto e = check_prompt_budget(facts, job, placed_length)) return e;
  // Cached images are taken now (holding their rows keeps them alive whatever the cache drops);
  // room for the others, each distinct one once, before any is encoded: it waits in the image
  // queue (engine/images.h).
  std::vector<std::optional<engine::PreparedImage>> cached(job.images.size());
  std::vector<engine::ImageDigest> digests(job.images.size());
  std::set<engine::ImageDigest> to_encode;
  int64_t row_bytes = 0;
  for (size_t i = 0; i < job.images.size(); ++i) {
    digests[i] = engine::image_digest(job.images[i]);
    cached[i] = facts.images->cached(digests[i]);
    if (cached[i]) continue;
    if (to_encode.insert(digests[i]).second) row_bytes += facts.images->rows_bytes(rows[i]);
  }
  const auto cancelled = [&] {
    return (facts.stopping && facts.stopping->load()) || (client_gone && client_gone());
  };
  auto room = facts.images->reserve_rows(row_bytes, cancelled);
  if (!room.ok()) {
    if (client_gone && client_gone()) // nobody reads the answer: counted as a hang-up
      return ApiError{kClientClosedRequest, room.message(), "messages", "client_closed_request"};
    ApiError e = api_error(room.status());
    e.param = "messages";
    return e;
  }
  std::vector<engine::PreparedImage> prepared;
  std::map<engine::ImageDigest, size_t> first; // the same bytes again take the same rows
  for (size_t i = 0; i < job.images.size(); ++i) {
    const auto [at, fresh] = first.emplace(digests[i], i);
    auto p = !fresh      ? Result<engine::PreparedImage>(prepared[at->second])
             : cached[i] ? Result<engine::PreparedImage>(*cached[i])
                         : facts.images->encode(job.images[i], &*room, cancelled);
    if (!p.ok() && client_gone && client_gone()) // its encode left the line or stopped
      return ApiError{kClientClosedRequest, p.message(), "messages", "client_closed_request"};
    if (!p.ok()) return image_error(i, p.status());
    job.image_tokens += p->rows->n_rows;
    prepared.push_back(std::move(p).value());
  }
  job.images.clear(); // the rows are what the request keeps
  auto placed = engine::place_images(job.request.prompt, job.request.message_starts,
                                     facts.image_markers, prepared, facts.n_vocab);
  if (!placed.ok()) // a template that wrote another number of image places than parts
    return ApiError{400, placed.message(), "messages", "template_error"};
  job.request.embeddings = std::move(placed).value();
  if (int64_t(job.request.prompt.size()) != placed_length) // count_rows and encode disagree
    return ApiError{500,
                    "the images took " + std::to_string(job.request.prompt.size()) +
                        " prompt positions, " + std::to_string(placed_length) + " were counted",
                    "messages", "server_error"};
  return std::nullopt;
}

} // namespace offgraph::server
