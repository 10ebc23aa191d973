// The files the server's image tests serve: a tiny Muse Glimmer text model with the default
// model's vocabulary (which holds the image tokens) and the real chat template, and a 2-layer
// synthetic mmproj projecting to its width. Written on construction, removed on destruction.
#pragma once

#include "synth/mmproj.h"
#include "synth/synth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace offgraph::server::testing {

// Standard base64 (RFC 4648, padded): what a data: URL carries.
inline std::string base64(const std::vector<uint8_t> &b) {
  static const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t n = uint32_t(b[i]) << 16 | (i + 1 < b.size() ? uint32_t(b[i + 1]) << 8 : 0) |
                       (i + 2 < b.size() ? b[i + 2] : 0);
    out += a[n >> 18 & 63], out += a[n >> 12 & 63];
    out += i + 1 < b.size() ? a[n >> 6 & 63] : '=';
    out += i + 2 < b.size() ? a[n & 63] : '=';
  }
  return out;
}

struct ImageModelFiles {
  std::string text, mmproj;
  explicit ImageModelFiles(const std::string &name) {
    const std::filesystem::path tmp = std::filesystem::temp_directory_path();
    const std::string tag = name + "-" + std::to_string(::getpid());
    text = (tmp / ("offgraph-" + tag + "-text.gguf")).string();
    mmproj = (tmp / ("offgraph-" + tag + "-mmproj.gguf")).string();
    synth::SynthSpec s = synth::preset("tiny", "muse-glimmer").value();
    s.vocab_path = std::string(OFFGRAPH_SOURCE_DIR) + "/models/muse-glimmer-kjv.gguf";
    s.template_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/templates/muse-glimmer.jinja";
    s.n_embd = 64, s.head_dim = 16, s.window = 16, s.seed = 3, s.weight_type = GGML_TYPE_F32;
    EXPECT_TRUE(synth::write_model(s, text).ok());
    synth::MmprojSpec m;
    m.n_layer = 2, m.n_embd_text = 64, m.seed = 9;
    EXPECT_TRUE(synth::write_mmproj(m, mmproj).ok());
  }
  ~ImageModelFiles() { std::filesystem::remove(text), std::filesystem::remove(mmproj); }
  ImageModelFiles(const ImageModelFiles &) = delete;
  ImageModelFiles &operator=(const ImageModelFiles &) = delete;
};

} // namespace offgraph::server::testing
