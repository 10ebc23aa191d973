// GGUF loading and validation on arbitrary bytes: our layout check, ggml's own parser (compiled
// with sanitizers in the fuzz and ASan trees), and the whole model path (GgufFile, read_config,
// the tensor checks, mapping), then the tokenizer and chat template a model file carries.
// Properties: nothing crashes, hangs or allocates beyond the fuzzer's limits; whatever ggml's
// parser refuses, our check refuses first (so users get our precise message); a refusal always
// carries a message.
#include "fuzz_util.h"

#include "model/gguf_file.h"
#include "model/model.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include "ggml.h"
#include "gguf.h"

#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

using namespace offgraph;

namespace {

// Reads every value with the getter its type calls for (ggml asserts on a wrong one).
void walk_metadata(const gguf_context *g) {
  for (int64_t i = 0; i < gguf_get_n_kv(g); ++i) {
    (void)gguf_get_key(g, i);
    const gguf_type t = gguf_get_kv_type(g, i);
    if (t == GGUF_TYPE_ARRAY) {
      const size_t n = gguf_get_arr_n(g, i);
      if (gguf_get_arr_type(g, i) == GGUF_TYPE_STRING) {
        for (size_t j = 0; j < n; ++j) (void)gguf_get_arr_str(g, i, j);
      } else if (n > 0) {
        (void)gguf_get_arr_data(g, i);
      }
    } else if (t == GGUF_TYPE_STRING) {
      (void)gguf_get_val_str(g, i);
    } else {
      (void)gguf_get_val_data(g, i);
    }
  }
  for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
    (void)gguf_get_tensor_name(g, i);
    (void)gguf_get_tensor_offset(g, i);
    (void)gguf_get_tensor_size(g, i);
  }
}

void use_model(const model::Model &m) {
  (void)m.config().describe();
  (void)m.geometry();
  (void)m.n_params();
  auto tok = text::Tokenizer::from_gguf(m.file().gguf());
  if (std::getenv("FUZZ_VERBOSE"))
    std::fprintf(stderr, "  tokenizer: %s\n", tok.ok() ? "ok" : tok.message().c_str());
  if (tok.ok()) {
    const auto ids = (*tok)->encode("Hello, world! <|eot|> 12345 \xe2\x82\xac", true, true);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < (*tok)->n_vocab(), "id %d", int(id));
    (void)(*tok)->decode(ids);
  } else {
    FUZZ_CHECK(!tok.message().empty(), "a tokenizer error without a message");
  }
  if (m.file().has("tokenizer.chat_template")) {
    auto source = m.file().str("tokenizer.chat_template");
    if (source.ok()) (void)text::Template::parse(*source);
  }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  // Most inputs are malformed; ggml would log every refusal.
  ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const auto layout = model::check_gguf_layout(data, size);
  FUZZ_CHECK(layout.ok() || !layout.message().empty(), "a refusal without a message");

  // ggml's parser on the same bytes.
  {
    ggml_context *meta = nullptr;
    gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/&meta};
    gguf_context *g = gguf_init_from_buffer(data, size, params);
    if (g) {
      walk_metadata(g);
      gguf_free(g);
      ggml_free(meta);
    } else {
      FUZZ_CHECK(!layout.ok(), "our layout check passed a file ggml's parser refuses");
    }
  }

  // The whole path from a file, as `offgraph serve -m` takes it.
  const int fd = memfd_create("gguf_fuzz", 0);
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0, "write to the memfd failed");
    done += size_t(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto m = model::Model::load(path);
  if (std::getenv("FUZZ_VERBOSE"))
    std::fprintf(stderr, "  layout: %s\n  load: %s\n",
                 layout.ok() ? "ok" : layout.message().c_str(),
                 m.ok() ? (*m)->config().describe().c_str() : m.message().c_str());
  if (m.ok()) {
    FUZZ_CHECK(layout.ok(), "a model loaded from bytes our layout check refuses: %s",
               layout.message().c_str());
    use_model(**m);
  } else {
    FUZZ_CHECK(!m.message().empty(), "a load error without a message");
    // A model without weights may still be a valid metadata-only file.
    auto meta = model::Model::open_metadata(path);
    if (meta.ok()) use_model(**meta);
  }
  close(fd);
  return 0;
}
