// Images in chat requests: OpenAI's image_url content parts ({"type": "image_url", "image_url":
// {"url": "data:image/png;base64,...", "detail": "auto"}}). Only data: URIs are taken: the server
// fetches nothing from the network. Each part becomes the template's {"type": "image"} (written
// as <|patch|>), and after parsing its bytes are encoded and its rows placed in the prompt.
#pragma once

#include "server/api.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace offgraph::server {

// Base64 (RFC 4648 §4: the standard alphabet, '=' padding optional), with the white space of
// MIME's line breaks (RFC 2045) skipped; an error that says what is wrong and where otherwise.
Result<std::vector<uint8_t>> decode_base64(std::string_view text);

// Validates one image_url part of `where` (e.g. "messages[1].content[0]") and rewrites it as
// {"type": "image"}; its bytes are appended to `bytes` when not null (the request needs them), else
// only checked for size.
std::optional<ApiError> take_image_part(json &part, const std::string &where,
                                        const ModelFacts &facts,
                                        std::vector<std::vector<uint8_t>> *bytes);

// Encodes a parsed job's images (Job::images) and puts their rows in its prompt
// (engine::place_images); then checks the context, as parse_request does for prompts without
// images. Called without the lock parse_request needs: the encoder is thread-safe, and slow.
// Images the encoder's cache holds are taken (and so kept) first; room is reserved for the rest
// (each distinct image once) before any is encoded, a wait that ends when `client_gone` says
// the client hung up (or the server stops).
// The status of a request whose client hung up before it was answered (nginx's 499): never
// read, counted as a disconnect, not as an error.
inline constexpr int kClientClosedRequest = 499;
std::optional<ApiError> attach_images(const ModelFacts &facts, Job &job,
                                      const std::function<bool()> &client_gone = {});

} // namespace offgraph::server
