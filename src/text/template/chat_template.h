// Renders Hugging Face chat templates (Jinja2) to the same bytes as transformers'
// apply_chat_template: a sandboxed Jinja2 environment with trim_blocks, lstrip_blocks and
// loopcontrols, `tojson` as plain json.dumps(ensure_ascii=False), and the globals
// raise_exception(msg) and strftime_now(fmt). See docs/chat-templates.md.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace offgraph::text {

namespace jinja {
struct Stmt;
}

struct ChatTemplateOptions {
  // The time strftime_now() formats; unset means the local time when render() is called.
  std::optional<std::tm> now;
};

class Template {
public:
  // A syntax error is reported with its line: "chat template syntax error at line N: ...".
  static Result<Template> parse(const std::string &source);

  // `context` holds the template's variables (messages, tools, add_generation_prompt, bos_token,
  // ...). Use ordered_json so mappings keep the caller's key order, as Python dicts do: templates
  // iterate arguments and print tool schemas in that order. A runtime error is reported with its
  // line; raise_exception(msg) is reported as msg alone.
  Result<std::string> render(const nlohmann::ordered_json &context,
                             const ChatTemplateOptions &options = {}) const;
  // For nlohmann::json, whose objects are sorted by key.
  Result<std::string> render(const nlohmann::json &context,
                             const ChatTemplateOptions &options = {}) const;

private:
  std::shared_ptr<const std::vector<std::shared_ptr<jinja::Stmt>>> body_;
};

// Parse and render in one step.
Result<std::string> render_chat_template(const std::string &template_source,
                                         const nlohmann::ordered_json &context,
                                         const ChatTemplateOptions &options = {});
Result<std::string> render_chat_template(const std::string &template_source,
                                         const nlohmann::json &context,
                                         const ChatTemplateOptions &options = {});

} // namespace offgraph::text
