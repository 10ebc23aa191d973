// `offgraph run` (one prompt, streamed) and `offgraph chat` (a conversation kept in the cache).
// Both run on the engine the server uses (engine/engine.h): one request at a time, the prefix tree
// keeping what earlier turns computed.
#include "commands.h"
#include "device_flags.h"
#include "image_flags.h"
#include "speculation_flags.h"

#include "engine/engine.h"
#include "kv/storage_types.h"
#include "sample/sampler.h"
#include "text/chat/chat_format.h"
#include "text/chat/chat_prompt.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <unistd.h>

namespace offgraph::cli {

namespace {

struct CommonOpts {
  std::string model, ctk = "f16", ctv = "f16", reasoning = "high", system, template_file;
  int32_t n_predict = 256, ctx = 4096, threads = 2, max_write = 256;
  // Unset sampling options keep the architecture's defaults.
  float temp = NAN, top_p = NAN, min_p = NAN, repeat_penalty = NAN;
  int32_t top_k = -1;
  uint64_t seed = 0;
  CLI::Option *seed_option = nullptr; // unset: a random seed
  SpeculationFlags spec;
  DeviceFlags devices;
  ImageFlags images;
};

void add_common(CLI::App *cmd, CommonOpts &o) {
  cmd->add_option("-m,--model", o.model, "the GGUF model (default: the shipped model)");
  cmd->add_option("-n,--n-predict", o.n_predict, "most tokens to generate")->capture_default_str();
  cmd->add_option("--temp", o.temp, "temperature (0: greedy); default: the model's recommendation");
  cmd->add_option("--top-k", o.top_k, "top-k (0 disables)");
  cmd->add_option("--top-p", o.top_p, "top-p (1 disables)");
  cmd->add_option("--min-p", o.min_p, "min-p (0 disables)");
  cmd->add_option("--repeat-penalty", o.repeat_penalty, "repetition penalty (1 disables)");
  o.seed_option = cmd->add_option("--seed", o.seed, "sampling seed (default: random)");
  cmd->add_option("--reasoning", o.reasoning,
                  "reasoning: none, minimal (thinking off where the template has an off), low, "
                  "medium, high, xhigh")
      ->capture_default_str();
  cmd->add_option("--system", o.system, "system message");
  cmd->add_option("--template", o.template_file, "chat template file (default: the model's own)");
  cmd->add_option("-c,--ctx", o.ctx, "context length")->capture_default_str();
  cmd->add_option("-b,--batch", o.max_write, "prefill chunk (max_write)")->capture_default_str();
  cmd->add_option("-t,--threads", o.threads, "threads")->capture_default_str();
  cmd->add_option("--ctk", o.ctk, "K cache type")->capture_default_str();
  cmd->add_option("--ctv", o.ctv, "V cache type")->capture_default_str();
  add_speculation_flags(*cmd, o.spec);
  add_device_flags(*cmd, o.devices);
  add_image_flags(*cmd, o.images);
}

// Everything a generation needs, loaded once.
struct Loaded {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::Model> draft_model; // --spec-draft-model
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<engine::Engine> engine;
  ImageInput images; // --mmproj: the vision model, its encoder, the marker tokens
  sample::SamplingParams sampling;
  std::string chat_template;
  std::optional<text::Template> parsed_template;
  // Turn t samples with seed + t: asking again after /undo draws a new answer, and a given --seed
  // still replays the whole session.
  uint64_t turn = 0;
  // What the template speaks: its parser splits reasoning and tool calls from the answer.
  text::ChatFormat format = text::ChatFormat::kPlain;
};

Result<Loaded> load(CommonOpts o, bool need_template) {
  Loaded l;
  if (o.model.empty()) {
    auto path = default_model();
    if (!path.ok()) return path.status();
    o.model = *path;
  }
  auto m = load_placed(o.model, o.devices, [](uint64_t d, uint64_t t) {
    if (t > (256u << 20)) progress_bar("loading", d, t);
  });
  if (!m.ok()) return m.status();
  report_placement(**m);
  l.model = std::move(m).value();
  auto tok = text::Tokenizer::from_gguf(o.model);
  if (!tok.ok()) return tok.status();
  l.tokenizer = std::move(tok).value();
  auto images = load_image_input(o.images, *l.model, *l.tokenizer, o.threads);
  if (!images.ok()) return images.status();
  l.images = std::move(images).value();
  auto ctk = kv::parse_storage_type(o.ctk), ctv = kv::parse_storage_type(o.ctv);
  if (!ctk.ok() || !ctv.ok()) return (ctk.ok() ? ctv : ctk).status();
  engine::EngineOptions eo;
  eo.context = o.ctx;
  eo.max_write = o.max_write;
  eo.step_tokens = o.max_write;
  eo.max_active = 1;
  eo.max_cached = 8; // the turns /undo can go back to without recomputing
  eo.types = {*ctk, *ctv};
  eo.threads = o.threads;
  auto spec = speculation_options(o.spec);
  if (!spec.ok()) return spec.status();
  eo.speculation = *spec;
  auto draft = load_draft_model(o.spec, o.model);
  if (!draft.ok()) return draft.status();
  l.draft_model = std::move(draft).value();
  eo.draft_model = l.draft_model.get();
  auto engine = engine::Engine::create(*l.model, eo);
  if (!engine.ok()) return engine.status();
  l.engine = std::move(engine).value();
  l.sampling = engine::default_sampling(*l.model);
  if (!std::isnan(o.temp)) l.sampling.temperature = o.temp;
  if (o.top_k >= 0) l.sampling.top_k = o.top_k;
  if (!std::isnan(o.top_p)) l.sampling.top_p = o.top_p;
  if (!std::isnan(o.min_p)) l.sampling.min_p = o.min_p;
  if (!std::isnan(o.repeat_penalty)) l.sampling.repetition_penalty = o.repeat_penalty;
  l.sampling.seed = o.seed_option && o.seed_option->count() ? o.seed : std::random_device{}();
  if (auto sampler = sample::Sampler::create(l.sampling, l.tokenizer->n_vocab()); !sampler.ok())
    return sampler.status();
  if (need_template) {
    if (!o.template_file.empty()) {
      std::ifstream in(o.template_file);
      if (!in) return Status::error("cannot read the template " + o.template_file);
      std::stringstream ss;
      ss << in.rdbuf();
      l.chat_template = ss.str();
    } else {
      auto t = l.model->file().str("tokenizer.chat_template");
      if (!t.ok())
        return Status::error(
            o.model + " embeds no chat template (tokenizer.chat_template); give --template FILE");
      l.chat_template = *t;
    }
    auto parsed = text::Template::parse(l.chat_template);
    if (!parsed.ok()) return Status::error("chat template: " + parsed.message());
    l.parsed_template = std::move(parsed).value();
    l.format = text::detect_chat_format(l.chat_template);
  }
  if (o.reasoning != "none" && o.reasoning != "minimal" && o.reasoning != "low" &&
      o.reasoning != "medium" && o.reasoning != "high" && o.reasoning != "xhigh")
    return Status::error("--reasoning must be none, minimal, low, medium, high or xhigh, not '" +
                         o.reasoning + "'");
  return l;
}

// A prompt's tokens with its images placed (engine/images.h: each marker becomes the image's
// rows between <|image_start|> and <|image_end|>), for Request::embeddings.
struct Prompt {
  std::vector<int32_t> tokens;
  std::vector<engine::Request::Embeddings> embeddings;
};

// Places `images` (in order) at the markers of `tokens`: as many markers as images, or an error
// (place_images names both counts).
Result<Prompt> place(const Loaded &l, std::vector<int32_t> tokens,
                     std::span<const engine::PreparedImage> images) {
  Prompt p{std::move(tokens), {}};
  if (!l.images.encoder) {
    if (!images.empty()) return Status::error("images need --mmproj");
    return p; // no vision model: the marker is text like any other
  }
  // Message starts matter to periodic snapshots only, which a one-conversation session does not
  // take (render_prompt drops them too).
  std::vector<int32_t> no_starts;
  auto placed = engine::place_images(p.tokens, no_starts, l.images.markers, images,
                                     l.model->config().n_vocab);
  if (!placed.ok()) return placed.status();
  p.embeddings = std::move(placed).value();
  return p;
}

// A user message: its images first (one image part each, which the template writes as its
// marker), then its text; plain text without images.
nlohmann::ordered_json user_message(const std::string &text, size_t n_images) {
  if (n_images == 0) return {{"role", "user"}, {"content", text}};
  nlohmann::ordered_json content = nlohmann::ordered_json::array();
  for (size_t i = 0; i < n_images; ++i) content.push_back({{"type", "image"}});
  content.push_back({{"type", "text"}, {"text", text}});
  return {{"role", "user"}, {"content", content}};
}

// Renders `messages` and places `images`, those of every message in order.
Result<Prompt> render_prompt(const Loaded &l, const nlohmann::ordered_json &messages,
                             const std::string &reasoning,
                             std::span<const engine::PreparedImage> images) {
  nlohmann::ordered_json ctx;
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = true;
  text::set_reasoning(l.format, reasoning, ctx);
  text::add_token_variables(*l.tokenizer, ctx);
  // Control tokens come only from the template's own text, never from what the user typed.
  auto tokens =
      text::tokenize_chat(*l.tokenizer, *l.parsed_template, ctx, {}, [&](std::string_view r) {
        return text::missing_generation_prompt(l.format, r, ctx);
      });
  if (!tokens.ok()) return Status::error("chat template: " + tokens.message());
  // Message starts matter to periodic snapshots only, which a one-conversation session does not
  // take (/undo goes back to prompt ends).
  return place(l, std::move(tokens->tokens), images);
}

// Computes `prompt` (what earlier turns left in the cache is reused, images included) and
// generates until an end-of-turn token, the limit or a full context; every piece of text goes to
// `on_text`. Returns the generated ids.
Result<std::vector<int32_t>> generate(Loaded &l, const Prompt &prompt, int32_t limit,
                                      bool render_control,
                                      const std::function<void(const std::string &)> &on_text) {
  const int32_t room = l.engine->options().context - int32_t(prompt.tokens.size());
  if (room < 1)
    return Status::error("the prompt has " + std::to_string(prompt.tokens.size()) +
                         " tokens; the context holds " +
                         std::to_string(l.engine->options().context));
  engine::Request r;
  r.prompt = prompt.tokens;
  r.embeddings = prompt.embeddings;
  r.sampling = l.sampling;
  r.sampling.seed = l.sampling.seed + l.turn++;
  r.max_tokens = std::min(limit, room);
  r.stop_tokens = l.tokenizer->end_of_generation_ids();
  text::Detokenizer detok(*l.tokenizer, render_control);
  std::vector<int32_t> out;
  std::string error;
  engine::FinishReason finish = engine::FinishReason::None;
  auto id = l.engine->submit(std::move(r), [&](const engine::Event &e) {
    if (e.token >= 0) {
      out.push_back(e.token);
      const std::vector<int32_t> &stops = l.tokenizer->end_of_generation_ids();
      const bool stop = std::find(stops.begin(), stops.end(), e.token) != stops.end();
      if (!stop || render_control) on_text(detok.feed(e.token));
    }
    if (e.finish != engine::FinishReason::None) finish = e.finish, error = e.error;
  });
  if (!id.ok()) return id.status();
  l.engine->run_until_idle();
  on_text(detok.flush());
  if (finish == engine::FinishReason::Error) return Status::error(error);
  if (finish == engine::FinishReason::Length && int32_t(out.size()) == room)
    std::fprintf(
        stderr,
        "\n[the context of %d tokens is full: /undo or /reset to go on, or a larger --ctx]\n",
        l.engine->options().context);
  return out;
}

void print_stats(const engine::EngineStats &s) {
  std::fprintf(stderr,
               "\nprompt: %lld tokens computed (%lld reused) in %.2f s, %.1f tok/s; generated: "
               "%lld tokens in %.2f s, %.1f tok/s\n",
               (long long)s.computed_prompt_tokens, (long long)s.reused_prompt_tokens,
               s.prefill_seconds,
               s.prefill_seconds > 0 ? double(s.computed_prompt_tokens) / s.prefill_seconds : 0.0,
               (long long)s.generated_tokens, s.decode_seconds,
               s.decode_seconds > 0 ? double(s.generated_tokens) / s.decode_seconds : 0.0);
  for (const auto &[name, d] : {std::pair{"ngram", &s.ngram}, std::pair{"draft", &s.draft}})
    if (d->verifications > 0)
      std::fprintf(stderr,
                   "speculative (%s): %lld drafted, %lld kept (%.0f%%), %.2f tokens per verify "
                   "step\n",
                   name, (long long)d->drafted, (long long)d->accepted,
                   100.0 * double(d->accepted) / double(std::max<int64_t>(d->drafted, 1)),
                   double(d->accepted + d->verifications) / double(d->verifications));
}

// Streams a chat format's events: reasoning dimmed on stderr, the answer on stdout, tool calls as
// JSON.
struct ChatPrinter {
  bool tty_err = isatty(2);
  void operator()(const std::vector<text::ChatEvent> &events) const {
    for (const auto &e : events) {
      switch (e.kind) {
      case text::ChatEvent::Kind::Reasoning:
        std::fprintf(stderr, "%s%s%s", tty_err ? "\x1b[2m" : "", e.text.c_str(),
                     tty_err ? "\x1b[0m" : "");
        break;
      case text::ChatEvent::Kind::Content:
        std::fputs(e.text.c_str(), stdout);
        break;
      case text::ChatEvent::Kind::ToolCall:
        std::printf("\n[tool call] %s %s\n", e.call.name.c_str(), e.call.arguments.dump().c_str());
        break;
      case text::ChatEvent::Kind::EndOfTurn:
        break;
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
};

} // namespace

std::function<int()> add_run(CLI::App &app) {
  struct Opts : CommonOpts {
    std::string prompt, file;
    std::vector<std::string> image_files;
    bool chat = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd = app.add_subcommand("run", "generate text from a prompt, streamed to stdout");
  add_common(cmd, *o);
  cmd->add_option("-p,--prompt", o->prompt, "the prompt");
  cmd->add_option("-f,--file", o->file, "read the prompt from a file");
  cmd->add_flag("--chat", o->chat,
                "wrap the prompt as a user message in the model's chat template");
  cmd->add_option("--image", o->image_files,
                  "an image (PNG, JPEG; with --mmproj; repeatable): at the prompt's next "
                  "<__media__> marker (before the text if it has none); with --chat, before the "
                  "text of the user message");
  return [o]() -> int {
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph run: %s\n", m.c_str()), 1;
    };
    if (!o->file.empty()) {
      std::ifstream in(o->file);
      if (!in) return fail("cannot read " + o->file);
      std::stringstream ss;
      ss << in.rdbuf();
      o->prompt = ss.str();
    }
    if (o->prompt.empty()) return fail("no prompt (give -p TEXT or -f FILE)");
    if (!o->image_files.empty() && o->images.mmproj.empty())
      return fail("--image needs --mmproj (the vision projector GGUF that encodes images)");
    auto loaded = load(*o, o->chat);
    if (!loaded.ok()) return fail(loaded.message());
    Loaded &l = *loaded;
    std::vector<engine::PreparedImage> images;
    if (!o->image_files.empty()) {
      auto encoded = encode_image_files(*l.images.encoder, o->image_files);
      if (!encoded.ok()) return fail(encoded.message());
      images = std::move(encoded).value();
    }
    Result<Prompt> prompt = Status::error("no prompt");
    if (o->chat) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
      messages.push_back(user_message(o->prompt, images.size()));
      prompt = render_prompt(l, messages, o->reasoning, images);
    } else if (l.images.encoder) {
      // With --mmproj, <__media__> in a raw prompt places an image (as llama-mtmd-cli).
      prompt = place(l,
                     tokenize_with_media(*l.tokenizer, o->prompt, l.images.markers.marker,
                                         images.size(), l.tokenizer->add_bos_default()),
                     images);
    } else {
      prompt = Prompt{l.tokenizer->encode(o->prompt, l.tokenizer->add_bos_default(), false), {}};
    }
    if (!prompt.ok()) return fail(prompt.message());
    auto parser = o->chat ? text::make_output_parser(l.format, nlohmann::json::array()) : nullptr;
    ChatPrinter print;
    auto out = generate(l, *prompt, o->n_predict, parser != nullptr, [&](const std::string &t) {
      if (t.empty()) return;
      if (parser) {
        print(parser->feed(t));
      } else {
        std::fputs(t.c_str(), stdout);
        std::fflush(stdout);
      }
    });
    if (parser) print(parser->finish());
    if (!out.ok()) return fail(out.message());
    std::printf("\n");
    print_stats(l.engine->stats());
    return 0;
  };
}

std::function<int()> add_chat(CLI::App &app) {
  auto o = std::make_shared<CommonOpts>();
  CLI::App *cmd = app.add_subcommand("chat", "an interactive chat kept in the cache between turns");
  add_common(cmd, *o);
  return [o]() -> int {
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph chat: %s\n", m.c_str()), 1;
    };
    auto loaded = load(*o, true);
    if (!loaded.ok()) return fail(loaded.message());
    Loaded &l = *loaded;
    const bool tty = isatty(0);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    // The images of each message (parallel to `messages`): every turn renders the whole history
    // with them, and the prefix tree reuses what earlier turns computed, image rows included.
    std::vector<std::vector<engine::PreparedImage>> message_images;
    std::vector<engine::PreparedImage> pending; // /image: for the next user message
    auto keep = [&](size_t n) {
      messages.erase(messages.begin() + long(n), messages.end());
      message_images.resize(n);
    };
    auto all_images = [&] {
      std::vector<engine::PreparedImage> all;
      for (const auto &m : message_images) all.insert(all.end(), m.begin(), m.end());
      return all;
    };
    if (!o->system.empty()) {
      messages.push_back({{"role", "system"}, {"content", o->system}});
      message_images.emplace_back();
    }
    std::string reasoning = o->reasoning;
    if (tty)
      std::fprintf(stderr,
                   "offgraph chat: /undo, /reset, /reasoning low|medium|high|xhigh,%s "
                   "/quit\n",
                   l.images.encoder ? " /image FILE," : "");
    for (std::string line;;) {
      if (tty) std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line)) break;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line == "/quit" || line == "/exit") break;
      if (line.empty()) continue;
      if (line == "/undo") {
        // Drop the last exchange; the next prompt resumes from the cache where it began (the
        // snapshot taken at that prompt's end).
        size_t n = messages.size();
        while (n > 0 && messages[n - 1]["role"] != "user") --n;
        if (n == 0) {
          std::fprintf(stderr, "nothing to undo\n");
          continue;
        }
        keep(n - 1); // with their images; images attached for the next message stay
        std::fprintf(stderr, "undone; %zu messages remain\n", messages.size());
        continue;
      }
      if (line == "/reset") {
        keep(!o->system.empty() ? 1 : 0);
        pending.clear();
        std::fprintf(stderr, "reset\n");
        continue;
      }
      if (line == "/image" || line.rfind("/image ", 0) == 0) {
        // As llama-mtmd-cli: the image goes with the next message, before its text.
        const size_t from = line.find_first_not_of(' ', 6);
        const std::string file = from == std::string::npos ? "" : line.substr(from);
        if (file.empty()) {
          std::fprintf(stderr, "/image FILE attaches an image to the next message\n");
          continue;
        }
        if (!l.images.encoder) {
          std::fprintf(stderr, "/image needs --mmproj (the vision projector GGUF)\n");
          continue;
        }
        auto image = encode_image_files(*l.images.encoder, {file});
        if (!image.ok()) {
          std::fprintf(stderr, "%s\n", image.message().c_str());
          continue;
        }
        const engine::PreparedImage &p = image->front();
        std::fprintf(stderr, "image %s: %dx%d, %d rows%s\n", file.c_str(), p.width, p.height,
                     p.rows->n_rows, p.from_cache ? " (cached)" : "");
        pending.push_back(p);
        continue;
      }
      if (line == "/reasoning" || line.rfind("/reasoning ", 0) == 0) {
        std::istringstream words(line.substr(10));
        std::string v;
        words >> v;
        if (v != "low" && v != "medium" && v != "high" && v != "xhigh") {
          std::fprintf(stderr, "reasoning strength is low, medium, high or xhigh\n");
          continue;
        }
        reasoning = v;
        std::fprintf(stderr, "reasoning strength: %s\n", v.c_str());
        continue;
      }
      messages.push_back(user_message(line, pending.size()));
      message_images.push_back(std::move(pending));
      pending.clear();
      auto prompt = render_prompt(l, messages, reasoning, all_images());
      if (!prompt.ok()) {
        keep(messages.size() - 1); // its images with it
        std::fprintf(stderr, "%s\n", prompt.message().c_str());
        continue;
      }
      auto parser = text::make_output_parser(l.format, nlohmann::json::array());
      ChatPrinter print;
      std::string plain; // the answer of a model whose template has no known format
      auto out = generate(l, *prompt, o->n_predict, parser != nullptr, [&](const std::string &t) {
        if (parser) {
          print(parser->feed(t));
        } else {
          plain += t;
          std::fputs(t.c_str(), stdout);
          std::fflush(stdout);
        }
      });
      if (parser) print(parser->finish());
      std::printf("\n");
      std::fflush(stdout);
      if (!out.ok()) {
        keep(messages.size() - 1);
        std::fprintf(stderr, "%s%s\n", out.message().c_str(),
                     messages.size() > 1 ? " (/undo or /reset frees the context)" : "");
        continue;
      }
      // History keeps the answer, not the reasoning (as the template drops it), so the next prompt
      // diverges right after this one's end: the snapshot there makes the reuse exact.
      nlohmann::ordered_json reply = {{"role", "assistant"},
                                      {"content", parser ? parser->message().content : plain}};
      if (parser && !parser->message().tool_calls.empty()) {
        nlohmann::ordered_json calls = nlohmann::ordered_json::array();
        for (const auto &c : parser->message().tool_calls)
          calls.push_back(
              {{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        reply["tool_calls"] = calls;
      }
      messages.push_back(reply);
      message_images.emplace_back();
    }
    print_stats(l.engine->stats());
    return 0;
  };
}

} // namespace offgraph::cli
