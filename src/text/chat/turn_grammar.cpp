#include "text/chat/turn_grammar.h"

#include "sample/grammar_exclude.h"

#include <algorithm>

namespace offgraph::text {

using sample::Element;
using sample::GrammarBuilder;
using sample::Sequence;
using ojson = nlohmann::ordered_json;

Sequence marked(GrammarBuilder &b, const Tokenizer &t, std::string_view text) {
  Sequence out;
  for (int32_t id : t.encode(text, false, true)) {
    if (t.is_control(id)) {
      out.push_back(GrammarBuilder::special(id));
      continue;
    }
    const Sequence bytes = b.literal(t.decode({id}));
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

Sequence join(std::initializer_list<Sequence> parts) {
  Sequence out;
  for (const Sequence &p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Result<Element> answer_content(GrammarBuilder &b, const TurnSpec &spec, Element text,
                               std::optional<sample::JsonSchemaCompiler> &compiler) {
  using Content = TurnSpec::Content;
  if (spec.content == Content::kText) return text;
  if (spec.content == Content::kGrammar) return b.embed(spec.grammar);
  compiler.emplace(b, spec.schema,
                   sample::JsonSchemaOptions{.strict = spec.schema_strict, .escape_lt = true});
  if (spec.content == Content::kJsonObject) return compiler->any_object();
  auto v = compiler->value(spec.schema, "#");
  if (!v.ok()) return Status::error("response_format.json_schema.schema: " + v.message());
  return v;
}

bool accepts_string(const ojson &schema) {
  if (!schema.is_object() || !schema.contains("type")) return false;
  const ojson &type = schema["type"];
  if (type.is_array())
    return std::any_of(type.begin(), type.end(), [](const ojson &x) { return x == "string"; });
  return type == "string";
}

Result<Element> raw_string_value(GrammarBuilder &b, sample::JsonSchemaCompiler &compiler,
                                 const ojson &params, const ojson &schema, const std::string &path,
                                 size_t &budget, std::span<const std::string> markers,
                                 std::string_view fallback_stop) {
  GrammarBuilder own;
  sample::JsonSchemaCompiler alone(own, params, {.strict = true, .escape_lt = true});
  auto v = alone.raw_string(schema, path, "");
  if (!v.ok()) return v;
  const uint32_t root = own.declare("value");
  own.define(root, {{*v}});
  auto g = std::move(own).finish(root);
  const size_t allowed = std::min(kMaxExcludedValueRules, budget);
  if (g.ok() && allowed > 0)
    if (auto f = sample::exclude_substrings(*g, markers, allowed); f.ok()) {
      budget -= std::min(budget, f->rules.size());
      return b.embed(*f);
    }
  return compiler.raw_string(schema, path, fallback_stop);
}

std::shared_ptr<const sample::TokenTexts> grammar_token_texts(const Tokenizer &tokenizer) {
  auto t = std::make_shared<sample::TokenTexts>();
  const int32_t n = tokenizer.n_vocab();
  t->bytes.resize(size_t(n));
  t->special.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    t->special[size_t(i)] = tokenizer.is_control(i);
    t->bytes[size_t(i)] =
        tokenizer.is_control(i) ? tokenizer.token_piece(i) : tokenizer.decode({i});
  }
  // End tokens end the answer wherever they come: never part of its text.
  for (int32_t id : tokenizer.end_of_generation_ids())
    if (id >= 0 && id < n) t->special[size_t(id)] = 1;
  return t;
}

Result<sample::Grammar> plain_answer_grammar(const TurnSpec &spec) {
  using Content = TurnSpec::Content;
  if (spec.content == Content::kGrammar) return spec.grammar;
  if (spec.content == Content::kJsonObject) return sample::json_object_grammar();
  if (spec.content == Content::kText) return Status::error("plain_answer_grammar: free text");
  auto g = sample::json_schema_grammar(spec.schema, {.strict = spec.schema_strict});
  if (!g.ok()) return Status::error("response_format.json_schema.schema: " + g.message());
  return g;
}

} // namespace offgraph::text
