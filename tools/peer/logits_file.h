// The logits file both `offgraph logits` and the llama.cpp peer write, so that one comparer reads
// both: magic "OGLT", u32 version 1, u32 n_vocab, u32 n_rows, u32 n_tokens, u32 n_prompt, then
// n_tokens u32 token ids (prompt, then greedy picks), then n_rows x n_vocab f32 logits, row i being
// the logits after consuming token i. Header-only, standard library only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace offgraph::peer {

struct LogitsFile {
  uint32_t n_vocab = 0;
  uint32_t n_prompt = 0;
  std::vector<uint32_t> tokens;
  std::vector<float> logits; // rows x n_vocab

  uint32_t n_rows() const { return n_vocab ? uint32_t(logits.size() / n_vocab) : 0; }

  bool write(const std::string &path) const {
    std::FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const uint32_t head[6] = {0x544c474f, 1, n_vocab, n_rows(), uint32_t(tokens.size()), n_prompt};
    bool ok = std::fwrite(head, sizeof head, 1, f) == 1 &&
              std::fwrite(tokens.data(), 4, tokens.size(), f) == tokens.size() &&
              std::fwrite(logits.data(), 4, logits.size(), f) == logits.size();
    return std::fclose(f) == 0 && ok;
  }

  // Empty string on success, else what is wrong.
  std::string read(const std::string &path) {
    std::FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return path + ": cannot open";
    uint32_t head[6];
    std::string err;
    if (std::fread(head, sizeof head, 1, f) != 1 || head[0] != 0x544c474f || head[1] != 1) {
      err = path + ": not a logits file";
    } else {
      n_vocab = head[2];
      n_prompt = head[5];
      tokens.resize(head[4]);
      logits.resize(size_t(head[3]) * head[2]);
      if (std::fread(tokens.data(), 4, tokens.size(), f) != tokens.size() ||
          std::fread(logits.data(), 4, logits.size(), f) != logits.size())
        err = path + ": truncated";
    }
    std::fclose(f);
    return err;
  }
};

} // namespace offgraph::peer
