// Walks a parsed template with Jinja2's scoping rules: `set` inside a for loop or macro stays
// local, `if` opens no scope, macros see the scope they were defined in, namespace() objects are
// shared.
#pragma once

#include <ctime>
#include <string>

#include "text/template/jinja_ast.h"

namespace offgraph::text::jinja {

struct RenderSettings {
  std::tm now{}; // what strftime_now formats
};

// Renders `body` with `context` (a dict Value) as the template's variables; throws TemplateError.
std::string render_body(const Body &body, const Value &context, const RenderSettings &settings);

} // namespace offgraph::text::jinja
