#include "text/template/chat_template.h"

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

Result<std::string> Template::render(const nlohmann::ordered_json &context,
                                     const ChatTemplateOptions &options) const {
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
  return render_chat_template(template_source, nlohmann::ordered_json::parse(context.dump()),
                              options);
}

} // namespace offgraph::text
