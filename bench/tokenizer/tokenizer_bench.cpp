// Tokenizer speed: encodes about 1 MB of mixed text (English, C++ code, CJK, emoji) and prints
// MB/s. Run by hand, never by ctest:
//   tokenizer_bench VOCAB.gguf [--text FILE] [--write FILE] [--ids FILE]
// --text reads the input from FILE; --write saves the generated text (to feed llama-tokenize);
// --ids writes the ids as `llama-tokenize --ids` prints them, so the two can be compared.
#include "text/tokenizer/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using offgraph::text::Tokenizer;

void append_cp(uint32_t cp, std::string &s) {
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Deterministic (fixed seed) mix: a quarter each of prose, code, CJK and emoji-laden chat.
std::string mixed_text(size_t bytes) {
  static const char *words[] = {
      "the",    "model",   "tokenizer", "quickly", "returns", "a",        "sequence", "of",
      "tokens", "which",   "attention", "layers",  "consume", "While",    "reading",  "GGUF",
      "files,", "we",      "check",     "every",   "key;",    "however,", "errors",   "don't",
      "abort.", "Numbers", "like",      "3.14159", "2026",    "and",      "1e-5",     "appear"};
  static const char *code[] = {"for (int i = 0; i < n; ++i) {\n",
                               "  sum += values[i] * weights[i];\n",
                               "}\n",
                               "    return Status::error(\"bad key: \" + key);\n",
                               "#include <vector>\n",
                               "def encode(self, text: str) -> list[int]:\n",
                               "        return [self.vocab[t] for t in text]\n",
                               "\tif (x != nullptr && x->ok()) { /* fast path */ }\n"};
  std::mt19937 rng(2026);
  std::string s;
  const auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  while (s.size() < bytes) {
    switch (s.size() * 4 / bytes) {
    case 0:
      for (int i = 0; i < 40; ++i) s += std::string(i ? " " : "") + words[pick(std::size(words))];
      s += ".\n\n";
      break;
    case 1:
      for (int i = 0; i < 8; ++i) s += code[pick(std::size(code))];
      break;
    case 2:
      for (int i = 0; i < 60; ++i) {
        append_cp(0x4E00 + static_cast<uint32_t>(pick(0x51A0 / 8)), s); // common CJK block part
        if (i % 17 == 16) append_cp(0x3002, s);                         // 。
      }
      s += "\n";
      break;
    default:
      s += "Great job ";
      for (int i = 0; i < 6; ++i) append_cp(0x1F600 + static_cast<uint32_t>(pick(80)), s);
      s += " see you at 10:30! 👍🏽 café naïve Grüße\n";
      break;
    }
  }
  return s;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf [--text FILE] [--write FILE] [--ids FILE]\n",
                 argv[0]);
    return 2;
  }
  std::string text, ids_path;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--text") {
      std::ifstream in(argv[i + 1], std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    } else if (flag == "--write") {
      text = mixed_text(1 << 20);
      std::ofstream(argv[i + 1], std::ios::binary) << text;
    } else if (flag == "--ids") {
      ids_path = argv[i + 1];
    }
  }
  if (text.empty()) text = mixed_text(1 << 20);

  const auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::from_gguf(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.message().c_str());
    return 1;
  }
  const auto t1 = std::chrono::steady_clock::now();
  const auto ids = (*tok)->encode(text, false, false); // cold: empty word cache
  const auto t2 = std::chrono::steady_clock::now();
  const auto again = (*tok)->encode(text, false, false); // warm
  const auto t3 = std::chrono::steady_clock::now();
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("vocab %s (%d tokens, pre %s): load %.3f s\n", argv[1], (*tok)->n_vocab(),
              (*tok)->pre_tokenizer_name().c_str(), secs(t0, t1));
  std::printf("text %.2f MB -> %zu tokens\n", mb, ids.size());
  std::printf("encode cold %.3f s (%.1f MB/s), warm %.3f s (%.1f MB/s)%s\n", secs(t1, t2),
              mb / secs(t1, t2), secs(t2, t3), mb / secs(t2, t3),
              again == ids ? "" : "  MISMATCH between runs");
  if (!ids_path.empty()) {
    std::ofstream out(ids_path);
    out << "[";
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
    out << "]\n";
  }
  return again == ids ? 0 : 1;
}
