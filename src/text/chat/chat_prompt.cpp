#include "text/chat/chat_prompt.h"

#include <string>

namespace offgraph::text {

namespace {

// U+E000 and U+E001 (private use): not whitespace, so templates that trim content keep them.
const std::string kOpen = "\xEE\x80\x80OG", kClose = "\xEE\x80\x81";

std::string placeholder(size_t i) { return kOpen + std::to_string(i) + kClose; }

// Replaces each protected string with a placeholder, remembering the originals.
void protect(nlohmann::ordered_json &value, std::vector<std::string> &originals) {
  if (!value.is_string()) return;
  originals.push_back(value.get<std::string>());
  value = placeholder(originals.size() - 1);
}

} // namespace

void add_token_variables(const Tokenizer &tokenizer, nlohmann::ordered_json &context) {
  context["bos_token"] = tokenizer.bos() >= 0 ? tokenizer.token_piece(tokenizer.bos()) : "";
  context["eos_token"] = tokenizer.eos() >= 0 ? tokenizer.token_piece(tokenizer.eos()) : "";
}

Result<ChatTokens> tokenize_chat(const Tokenizer &tokenizer, const Template &chat_template,
                                 const nlohmann::ordered_json &context,
                                 const ChatTemplateOptions &options,
                                 const std::function<std::string(std::string_view)> &complete) {
  nlohmann::ordered_json guarded = context;
  std::vector<std::string> originals;
  if (guarded.contains("messages") && guarded["messages"].is_array()) {
    for (auto &m : guarded["messages"]) {
      // The model's own turns are left to the template, which may legitimately reshape them
      // (e.g. cut a reasoning section with split()); what callers type is protected.
      if (!m.is_object() || (m.contains("role") && m["role"] == "assistant")) continue;
      if (m.contains("content")) {
        auto &c = m["content"];
        if (c.is_string())
          protect(c, originals);
        else if (c.is_array())
          for (auto &part : c)
            if (part.is_object() && part.contains("text")) protect(part["text"], originals);
      }
    }
  }
  auto rendered = chat_template.render(guarded, options);
  if (!rendered.ok()) return rendered.status();
  if (complete) *rendered += complete(*rendered);

  // Split at the placeholders; each must appear exactly as written, in order, once.
  ChatTokens out;
  std::vector<int32_t> &tokens = out.tokens;
  const std::string &text = *rendered;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kOpen, at);
    const std::string_view head(text.data() + at,
                                (open == std::string::npos ? text.size() : open) - at);
    const auto plain = tokenizer.encode(head, false, true);
    tokens.insert(tokens.end(), plain.begin(), plain.end());
    if (open == std::string::npos) break;
    const size_t close = text.find(kClose, open);
    if (close == std::string::npos)
      return Status::error("chat template mangled a message placeholder");
    const std::string index = text.substr(open + kOpen.size(), close - open - kOpen.size());
    size_t i = 0;
    try {
      i = std::stoul(index);
    } catch (...) {
      return Status::error("chat template mangled a message placeholder");
    }
    if (i >= originals.size()) return Status::error("chat template mangled a message placeholder");
    const auto user = tokenizer.encode_literal(originals[i]);
    const int32_t start = int32_t(tokens.size());
    if (!user.empty() && (out.message_starts.empty() || out.message_starts.back() < start))
      out.message_starts.push_back(start);
    tokens.insert(tokens.end(), user.begin(), user.end());
    at = close + kClose.size();
  }
  return out; // a template may drop a message; it cannot forge one
}

} // namespace offgraph::text
