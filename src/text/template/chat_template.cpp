#include "text/template/chat_template.h"

#include <vector>

#include <chrono>

#include "text/template/jinja_ast.h"
#include "text/template/jinja_render.h"

namespace offgraph::text {

namespace {

std::string describe(const jinja::TemplateError &e, const char *what) {
  if (e.user_raised()) return e.what();
  std::string out = what;
  if (e.line() > 0) out += " at line " + std::to_string(e.line());
  return out + ": " + e.what();
}

} // namespace

Result<Template> Template::parse(const std::string &source) {
  try {
    Template t;
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse_template(source));
    return t;
  } catch (const jinja::TemplateError &e) {
    return Status::error(describe(e, "chat template syntax error"));
  } catch (const std::exception &e) {
    return Status::error(std::string("chat template syntax error: ") + e.what());
  }
}

namespace {

// Contexts come from clients; converting or printing a JSON value recurses, so a value nested
// thousands deep would overflow the stack. Measured without recursion.
template <class Json> bool nested_too_deeply(const Json &root, size_t limit) {
  std::vector<std::pair<const Json *, size_t>> stack = {{&root, 1}};
  while (!stack.empty()) {
    auto [j, depth] = stack.back();
    stack.pop_back();
    if (depth > limit) return true;
    if (j->is_array() || j->is_object())
      for (const auto &child : *j) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

constexpr size_t kMaxContextDepth = 128;

} // namespace

Result<std::string> Template::render(const nlohmann::ordered_json &context,
                                     const ChatTemplateOptions &options) const {
  if (nested_too_deeply(context, kMaxContextDepth))
    return Status::error("chat template context is nested deeper than " +
                         std::to_string(kMaxContextDepth) + " levels");
  jinja::RenderSettings settings;
  if (options.now) {
    settings.now = *options.now;
  } else {
    std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    localtime_r(&t, &settings.now);
  }
  try {
    if (!context.is_object() && !context.is_null())
      return Status::error("chat template context must be a JSON object");
    return jinja::render_body(*body_, jinja::Value::from_json(context), settings);
  } catch (const jinja::TemplateError &e) {
    return Status::error(describe(e, "chat template error"));
  } catch (const std::exception &e) {
    // std::stoll and friends on absurd literals, allocation failure: still an error, not a crash.
    return Status::error(std::string("chat template error: ") + e.what());
  }
}

Result<std::string> Template::render(const nlohmann::json &context,
                                     const ChatTemplateOptions &options) const {
  if (nested_too_deeply(context, kMaxContextDepth))
    return Status::error("chat template context is nested deeper than " +
                         std::to_string(kMaxContextDepth) + " levels");
  return render(nlohmann::ordered_json::parse(context.dump()), options);
}

Result<std::string> render_chat_template(const std::string &template_source,
                                         const nlohmann::ordered_json &context,
                                         const ChatTemplateOptions &options) {
  auto t = Template::parse(template_source);
  if (!t.ok()) return t.status();
  return t->render(context, options);
}

Result<std::string> render_chat_template(const std::string &template_source,
                                         const nlohmann::json &context,
                                         const ChatTemplateOptions &options) {
  auto t = Template::parse(template_source);
  if (!t.ok()) return t.status();
  return t->render(context, options); // checks the depth before converting
}

} // namespace offgraph::text
