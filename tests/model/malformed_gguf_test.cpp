// The malformed model corpus: GGUF files generated broken in every way a hostile or damaged file
// can be (truncated anywhere, wrong value types, huge, negative and zero dimensions, element
// counts and sizes that overflow, tensor data outside the file or misaligned, duplicated keys and
// tensor names, absurd vocabulary sizes, strings and arrays claiming more bytes than exist, bad
// alignments, unknown types). Each is loaded in a child process, which must exit normally with an
// error naming the problem, and whose peak memory must stay within kMaxGrowthKb of the parent's:
// nothing a file claims is allocated before the bytes are seen to be there. The named files are
// written to <build>/tests/model/malformed/ for inspection; the sweeps (every truncation point,
// byte mutations) run from memory.
#include "model/model.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define OFFGRAPH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OFFGRAPH_ASAN 1
#endif
#endif

#ifdef OFFGRAPH_ASAN
// Under ASan (no address-space limit possible) a single allocation over 1 GiB is itself an error.
// The quarantine (freed memory held back to catch use after free, 256 MB by default) is kept
// small so that peak RSS over thousands of loads measures the loader, not ASan.
extern "C" const char *__asan_default_options() {
  return "max_allocation_size_mb=1024:quarantine_size_mb=4";
}
#endif

namespace offgraph::model {
namespace {

namespace fs = std::filesystem;

// How much more memory (peak RSS) a child may use than the parent had: the files are a few KB.
constexpr long kMaxGrowthKb = 64 * 1024;

size_t g_tried = 0;       // malformed files tried, for the summary line
long g_max_growth_kb = 0; // the largest peak-memory growth seen

// ---- a GGUF writer that writes whatever it is told, valid or not -------------------------------

enum : uint32_t { U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 };

template <class T> std::string raw(T v) {
  return std::string(reinterpret_cast<char *>(&v), sizeof v);
}
std::string gstr(const std::string &s) { return raw<uint64_t>(s.size()) + s; }

struct Kv {
  std::string key;
  uint32_t type;
  std::string payload; // the encoded value after the type
};
Kv kv_u32(const std::string &k, uint32_t v) { return {k, U32, raw(v)}; }
Kv kv_i32(const std::string &k, int32_t v) { return {k, I32, raw(v)}; }
Kv kv_u64(const std::string &k, uint64_t v) { return {k, U64, raw(v)}; }
Kv kv_f32(const std::string &k, float v) { return {k, F32, raw(v)}; }
Kv kv_str(const std::string &k, const std::string &v) { return {k, STR, gstr(v)}; }
Kv kv_arr(const std::string &k, uint32_t elem, uint64_t n, const std::string &items) {
  return {k, ARR, raw(elem) + raw(n) + items};
}
Kv kv_strs(const std::string &k, const std::vector<std::string> &v) {
  std::string items;
  for (const auto &s : v) items += gstr(s);
  return kv_arr(k, STR, v.size(), items);
}
Kv kv_i32s(const std::string &k, const std::vector<int32_t> &v) {
  std::string items;
  for (int32_t x : v) items += raw(x);
  return kv_arr(k, I32, v.size(), items);
}

struct Tensor {
  Tensor(std::string n, std::vector<int64_t> d) : name(std::move(n)), dims(std::move(d)) {}
  std::string name;
  std::vector<int64_t> dims;
  int32_t type = GGML_TYPE_F32;
  std::optional<uint64_t> offset; // default: the next aligned offset
};

struct Gguf {
  std::string magic = "GGUF";
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv; // default: the real counts
  std::vector<Kv> kvs;
  std::vector<Tensor> tensors;
  uint64_t alignment = 32;
  bool data = true;

  Kv *find(const std::string &key) {
    for (auto &k : kvs)
      if (k.key == key) return &k;
    return nullptr;
  }
  void set(Kv kv) {
    if (Kv *k = find(kv.key))
      *k = kv;
    else
      kvs.push_back(kv);
  }
  void erase(const std::string &key) {
    std::erase_if(kvs, [&](const Kv &k) { return k.key == key; });
  }
  Tensor *tensor(const std::string &name) {
    for (auto &t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }

  std::string bytes() const {
    std::string out = magic + raw(version) + raw<uint64_t>(n_tensors.value_or(tensors.size())) +
                      raw<uint64_t>(n_kv.value_or(kvs.size()));
    for (const Kv &k : kvs) out += gstr(k.key) + raw(k.type) + k.payload;
    uint64_t next = 0;
    for (const Tensor &t : tensors) {
      out += gstr(t.name) + raw<uint32_t>(uint32_t(t.dims.size()));
      uint64_t n = 1;
      for (int64_t d : t.dims) out += raw(d), n *= uint64_t(d);
      out += raw(t.type) + raw<uint64_t>(t.offset.value_or(next));
      const bool known =
          t.type >= 0 && t.type < GGML_TYPE_COUNT && ggml_blck_size(ggml_type(t.type)) > 0;
      const uint64_t size =
          known ? n / ggml_blck_size(ggml_type(t.type)) * ggml_type_size(ggml_type(t.type)) : 0;
      next += (size + alignment - 1) / alignment * alignment;
    }
    if (!tensors.empty()) out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    if (data) out.append(size_t(next), '\0');
    return out;
  }
};

// A valid Llama model: 1 layer, embedding 8, 2 heads (1 KV head), FFN 16, a 40-token byte-level
// vocabulary with control tokens and a chat template.
Gguf good_llama() {
  Gguf g;
  std::vector<std::string> tokens;
  for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
  for (const char *t : {"\xc4\xa0", "!", ",", "0", "1", "ab", "<|begin_of_text|>",
                        "<|end_of_text|>", "<|start|>", "<|message|>", "<|eot|>", "xx", "yy", "zz"})
    tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i].rfind("<|", 0) == 0) types[i] = 3;
  g.kvs = {kv_str("general.architecture", "llama"),
           kv_str("general.name", "malformed-base"),
           kv_u32("llama.block_count", 1),
           kv_u32("llama.embedding_length", 8),
           kv_u32("llama.feed_forward_length", 16),
           kv_u32("llama.attention.head_count", 2),
           kv_u32("llama.attention.head_count_kv", 1),
           kv_u32("llama.context_length", 256),
           kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f),
           kv_f32("llama.rope.freq_base", 10000.0f),
           kv_str("tokenizer.ggml.model", "gpt2"),
           kv_str("tokenizer.ggml.pre", "llama-bpe"),
           kv_strs("tokenizer.ggml.tokens", tokens),
           kv_i32s("tokenizer.ggml.token_type", types),
           kv_strs("tokenizer.ggml.merges", {"a b"}),
           kv_u32("tokenizer.ggml.bos_token_id", 32),
           kv_u32("tokenizer.ggml.eos_token_id", 33),
           kv_str("tokenizer.chat_template",
                  "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>"
                  "{% endfor %}")};
  const int64_t E = 8, V = int64_t(tokens.size()), F = 16, D = 4;
  g.tensors = {{"token_embd.weight", {E, V}},       {"output_norm.weight", {E}},
               {"output.weight", {E, V}},           {"blk.0.attn_norm.weight", {E}},
               {"blk.0.attn_q.weight", {E, 2 * D}}, {"blk.0.attn_k.weight", {E, D}},
               {"blk.0.attn_v.weight", {E, D}},     {"blk.0.attn_output.weight", {2 * D, E}},
               {"blk.0.ffn_norm.weight", {E}},      {"blk.0.ffn_gate.weight", {E, F}},
               {"blk.0.ffn_up.weight", {E, F}},     {"blk.0.ffn_down.weight", {F, E}}};
  return g;
}

// ---- running a load in a child ----------------------------------------------------------------

long rss_kb() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct Isolated {
  bool exited = false;
  int code = -1, signal = 0;
  std::string report; // what the child wrote: "" when every check passed
  long growth_kb = 0; // peak RSS over the parent's
};

// Runs `body` in a child (address space limited to 4 GiB where ASan allows it) and returns its
// report and peak memory.
Isolated isolated(const std::function<std::string()> &body) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const long base = rss_kb();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr); // refusals are expected
#ifndef OFFGRAPH_ASAN
    rlimit lim{rlim_t(4) << 30, rlim_t(4) << 30};
    setrlimit(RLIMIT_AS, &lim);
#endif
    std::string report;
    try {
      report = body();
    } catch (const std::exception &e) {
      report = std::string("exception escaped: ") + e.what();
    }
    const char *p = report.data();
    for (size_t left = report.size(); left > 0;) {
      const ssize_t n = write(fds[1], p, left);
      if (n <= 0) break;
      p += n, left -= size_t(n);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  Isolated r;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) r.report.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.growth_kb = usage.ru_maxrss - base;
  return r;
}

void expect_clean(const Isolated &r, const std::string &what) {
  EXPECT_TRUE(r.exited && r.code == 0)
      << what << ": the child died (signal " << r.signal << ", exit " << r.code << ")";
  EXPECT_EQ(r.report, "") << what;
  EXPECT_LT(r.growth_kb, kMaxGrowthKb) << what << ": peak memory grew by " << r.growth_kb << " KB";
  g_max_growth_kb = std::max(g_max_growth_kb, r.growth_kb);
}

// A file in memory, reachable by path.
class MemFile {
public:
  explicit MemFile(const std::string &bytes) : fd_(memfd_create("malformed", 0)) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) break;
      done += size_t(n);
    }
  }
  ~MemFile() { close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

private:
  int fd_;
};

// Everything a server does with a model file, in order; the first error, or "" when it loads.
// Every part must fail with a message or succeed, never crash.
std::string load_everything(const std::string &path) {
  auto m = Model::load(path);
  auto tok = text::Tokenizer::from_gguf(path);
  if (!tok.ok() && tok.message().empty()) return "\x01tokenizer error without a message";
  if (!m.ok()) return m.message().empty() ? "\x01model error without a message" : m.message();
  if (!tok.ok()) return tok.message();
  (void)(*tok)->encode("Hello <|eot|> world", true, true);
  auto src = (*m)->file().str("tokenizer.chat_template");
  if (src.ok()) {
    auto t = text::Template::parse(*src);
    if (!t.ok()) return t.message();
  }
  return "";
}

fs::path corpus_dir() {
  const fs::path dir = fs::path(OFFGRAPH_MALFORMED_DIR);
  fs::create_directories(dir);
  return dir;
}

// A named malformed file: written out, loaded in a child; its error must mention `mentions`.
void expect_refused(const std::string &name, const std::string &bytes,
                    const std::string &mentions) {
  const fs::path path = corpus_dir() / (name + ".gguf");
  std::ofstream(path, std::ios::binary) << bytes;
  ++g_tried;
  const Isolated r = isolated([&] {
    const std::string err = load_everything(path.string());
    if (err.empty()) return "loaded, expected an error mentioning '" + mentions + "'";
    if (err[0] == '\x01') return err.substr(1);
    if (err.find(mentions) == std::string::npos)
      return "error '" + err + "' does not mention '" + mentions + "'";
    return std::string();
  });
  expect_clean(r, name);
}
void expect_refused(const std::string &name, const Gguf &g, const std::string &mentions) {
  expect_refused(name, g.bytes(), mentions);
}

// An edited copy of the base file.
Gguf edit(const std::function<void(Gguf &)> &f) {
  Gguf g = good_llama();
  f(g);
  return g;
}

TEST(MalformedGguf, TheBaseFileLoads) {
  const fs::path path = corpus_dir() / "base.gguf";
  std::ofstream(path, std::ios::binary) << good_llama().bytes();
  expect_clean(isolated([&] { return load_everything(path.string()); }), "base.gguf");
}

TEST(MalformedGguf, Header) {
  const std::string good = good_llama().bytes();
  expect_refused("short", std::string("GGUF\3\0", 6), "too short to be a GGUF file");
  expect_refused("not_gguf", "GGML" + good.substr(4), "not a GGUF file");
  expect_refused("version_1", edit([](Gguf &g) { g.version = 1; }),
                 "GGUF version 1 is not supported");
  expect_refused("version_huge", edit([](Gguf &g) { g.version = 0xFFFFFFFFu; }),
                 "GGUF version 4294967295 is not supported");
  expect_refused("truncated_counts", good.substr(0, 20), "the file ends inside the header");
  expect_refused("tensors_2_63", edit([](Gguf &g) { g.n_tensors = uint64_t(1) << 63; }),
                 "claims 9223372036854775808 tensors; at most 65536");
  expect_refused("tensors_minus_1", edit([](Gguf &g) { g.n_tensors = ~uint64_t(0); }),
                 "claims 18446744073709551615 tensors");
  expect_refused("keys_2_40", edit([](Gguf &g) { g.n_kv = uint64_t(1) << 40; }),
                 "claims 1099511627776 metadata keys; at most 65536");
  expect_refused("keys_more_than_fit", edit([](Gguf &g) { g.n_kv = 60000; }), "more than the");
  expect_refused("tensors_more_than_fit", edit([](Gguf &g) { g.n_tensors = 30000; }),
                 "more than the");
  expect_refused("keys_one_too_many", edit([](Gguf &g) { g.n_kv = g.kvs.size() + 1; }),
                 "malformed GGUF");
}

TEST(MalformedGguf, TruncatedAnywhere) {
  Gguf meta = good_llama();
  meta.data = false;
  const std::string good = good_llama().bytes();
  const size_t data_at = meta.bytes().size();
  // Named cuts: inside a key's name, a string array, the tensor table, before and in the data.
  const size_t key_at = good.find("tokenizer.chat_template");
  expect_refused("truncated_key_name", good.substr(0, key_at + 5),
                 "the name of key #17 claims 23 bytes");
  const size_t tokens_at = good.find("tokenizer.ggml.tokens");
  expect_refused("truncated_token_array", good.substr(0, tokens_at + 200),
                 "key 'tokenizer.ggml.tokens' claims 40 elements");
  const size_t table_at = good.find("blk.0.attn_q.weight");
  expect_refused("truncated_tensor_table", good.substr(0, table_at + 30),
                 "tensor 'blk.0.attn_q.weight'");
  expect_refused("truncated_before_data", good.substr(0, data_at - 3),
                 "the tensor data would start at byte");
  expect_refused("truncated_data", good.substr(0, good.size() - 100),
                 "holds no weights (tensor 'blk.0.ffn_down.weight' needs bytes");

  // Every cut of the metadata and tensor table, and every 64th byte of the data: no crash, an
  // error with a message, bounded memory. One child runs them all.
  size_t cuts = 0;
  const Isolated r = isolated([&] {
    for (size_t n = 0; n < good.size(); n += n < data_at ? 1 : 64) {
      const MemFile f(good.substr(0, n));
      const std::string err = load_everything(f.path());
      if (err.empty()) return "a file cut to " + std::to_string(n) + " bytes loaded";
      if (err[0] == '\x01') return err.substr(1);
    }
    return std::string();
  });
  for (size_t n = 0; n < good.size(); n += n < data_at ? 1 : 64) ++cuts;
  g_tried += cuts;
  expect_clean(r, "truncations");
}

TEST(MalformedGguf, WrongValueTypes) {
  expect_refused("block_count_string",
                 edit([](Gguf &g) { g.set(kv_str("llama.block_count", "five")); }),
                 "key 'llama.block_count' should be u32");
  expect_refused("embedding_length_f32",
                 edit([](Gguf &g) { g.set(kv_f32("llama.embedding_length", 8.0f)); }),
                 "key 'llama.embedding_length' should be u32");
  expect_refused("architecture_u32",
                 edit([](Gguf &g) { g.set(kv_u32("general.architecture", 1)); }),
                 "key 'general.architecture' should be string but is u32");
  expect_refused("epsilon_string", edit([](Gguf &g) {
                   g.set(kv_str("llama.attention.layer_norm_rms_epsilon", "x"));
                 }),
                 "'llama.attention.layer_norm_rms_epsilon' should be f32");
  expect_refused("tokens_int_array", edit([](Gguf &g) {
                   g.set(kv_i32s("tokenizer.ggml.tokens", {1, 2, 3}));
                 }),
                 "'tokenizer.ggml.tokens' is not an array of strings");
  expect_refused("token_type_short", edit([](Gguf &g) {
                   g.set(kv_i32s("tokenizer.ggml.token_type", {1, 1}));
                 }),
                 "tokenizer.ggml.token_type must be an int32 array with one entry per token");
  expect_refused("tokenizer_model_u32",
                 edit([](Gguf &g) { g.set(kv_u32("tokenizer.ggml.model", 2)); }),
                 "'tokenizer.ggml.model' is not a string");
  expect_refused("bos_string",
                 edit([](Gguf &g) { g.set(kv_str("tokenizer.ggml.bos_token_id", "1")); }),
                 "'tokenizer.ggml.bos_token_id' is not a 32-bit integer");
  expect_refused("alignment_u64", edit([](Gguf &g) { g.set(kv_u64("general.alignment", 32)); }),
                 "key 'general.alignment' must be u32 but is u64");
  expect_refused("alignment_string",
                 edit([](Gguf &g) { g.set(kv_str("general.alignment", "32")); }),
                 "key 'general.alignment' must be u32 but is string");
  expect_refused("unknown_value_type", edit([](Gguf &g) { g.kvs[1].type = 13; }),
                 "key 'general.name' has unknown value type 13");
  expect_refused("unknown_value_type_max", edit([](Gguf &g) { g.kvs[1].type = 0xFFFFFFFFu; }),
                 "has unknown value type 4294967295");
  expect_refused("array_of_arrays",
                 edit([](Gguf &g) { g.set(kv_arr("x.nested", ARR, 1, std::string(16, '\0'))); }),
                 "key 'x.nested' is an array of arrays");
  expect_refused("array_of_unknown",
                 edit([](Gguf &g) { g.set(kv_arr("x.odd", 99, 1, std::string(8, '\0'))); }),
                 "key 'x.odd' is an array of unknown type 99");
  expect_refused("unsupported_tokenizer",
                 edit([](Gguf &g) { g.set(kv_str("tokenizer.ggml.model", "llama")); }),
                 "tokenizer model 'llama' (tokenizer.ggml.model) is not supported");
  expect_refused("unknown_pre_tokenizer",
                 edit([](Gguf &g) { g.set(kv_str("tokenizer.ggml.pre", "klingon")); }),
                 "unsupported pre-tokenizer 'klingon'");
  expect_refused("merge_without_space",
                 edit([](Gguf &g) { g.set(kv_strs("tokenizer.ggml.merges", {"ab"})); }),
                 "tokenizer.ggml.merges[0] = 'ab' is not two tokens separated by a space");
  expect_refused("unknown_architecture",
                 edit([](Gguf &g) { g.set(kv_str("general.architecture", "mamba")); }),
                 "architecture 'mamba' is not supported");
  expect_refused("chat_template_syntax",
                 edit([](Gguf &g) { g.set(kv_str("tokenizer.chat_template", "{% for %}")); }),
                 "chat template syntax error");
}

TEST(MalformedGguf, HyperparametersOutOfRange) {
  expect_refused("block_count_0", edit([](Gguf &g) { g.set(kv_u32("llama.block_count", 0)); }),
                 "'llama.block_count' = 0 is outside 1..4096");
  expect_refused("block_count_2_31",
                 edit([](Gguf &g) { g.set(kv_u32("llama.block_count", 1u << 31)); }),
                 "'llama.block_count' = 2147483648 is outside 1..4096");
  expect_refused("embedding_negative",
                 edit([](Gguf &g) { g.set(kv_i32("llama.embedding_length", -8)); }),
                 "'llama.embedding_length' = -8 is out of range");
  expect_refused("context_2_40",
                 edit([](Gguf &g) { g.set(kv_u64("llama.context_length", uint64_t(1) << 40)); }),
                 "'llama.context_length' = 1099511627776 is out of range");
  expect_refused("context_u64_max",
                 edit([](Gguf &g) { g.set(kv_u64("llama.context_length", ~0ull)); }),
                 "'llama.context_length'");
  expect_refused("heads_0", edit([](Gguf &g) { g.set(kv_u32("llama.attention.head_count", 0)); }),
                 "'llama.attention.head_count' = 0 is outside 1..65536");
  expect_refused("heads_not_multiple",
                 edit([](Gguf &g) { g.set(kv_u32("llama.attention.head_count_kv", 3)); }),
                 "2 attention heads are not a multiple of 3 KV heads");
  expect_refused("heads_more_than_embedding", edit([](Gguf &g) {
                   g.set(kv_u32("llama.attention.head_count", 16));
                   g.set(kv_u32("llama.attention.head_count_kv", 16));
                 }),
                 "head dim is 0");
  expect_refused("epsilon_nan", edit([](Gguf &g) {
                   g.set(kv_f32("llama.attention.layer_norm_rms_epsilon",
                                std::numeric_limits<float>::quiet_NaN()));
                 }),
                 "'llama.attention.layer_norm_rms_epsilon' = nan is outside");
  expect_refused("rope_base_inf", edit([](Gguf &g) {
                   g.set(kv_f32("llama.rope.freq_base", std::numeric_limits<float>::infinity()));
                 }),
                 "'llama.rope.freq_base' = inf is outside");
  expect_refused("bos_outside_vocab",
                 edit([](Gguf &g) { g.set(kv_u32("tokenizer.ggml.bos_token_id", 1000000000)); }),
                 "'tokenizer.ggml.bos_token_id' = 1000000000 lies outside the vocabulary of 40");
  expect_refused("eos_negative",
                 edit([](Gguf &g) { g.set(kv_i32("tokenizer.ggml.eos_token_id", -1)); }),
                 "'tokenizer.ggml.eos_token_id' = -1 lies outside the vocabulary");
  expect_refused("no_tokens", edit([](Gguf &g) {
                   g.set(kv_strs("tokenizer.ggml.tokens", {}));
                   g.erase("tokenizer.ggml.token_type");
                 }),
                 "tokenizer.ggml.tokens holds 0 tokens");
}

TEST(MalformedGguf, AbsurdCountsAndLengths) {
  // Vocabularies and arrays claiming more elements than any model has, or than the file holds.
  expect_refused("vocab_2_40", edit([](Gguf &g) {
                   g.set(kv_arr("tokenizer.ggml.tokens", STR, uint64_t(1) << 40, ""));
                 }),
                 "key 'tokenizer.ggml.tokens' claims 1099511627776 elements; at most 4194304");
  expect_refused("vocab_4m_in_a_small_file", edit([](Gguf &g) {
                   g.set(kv_arr("tokenizer.ggml.tokens", STR, 4000000, gstr("a")));
                 }),
                 "claims 4000000 elements of type string (at least 32000000 bytes) but only");
  expect_refused("u8_array_2_62",
                 edit([](Gguf &g) { g.set(kv_arr("x.bytes", U8, uint64_t(1) << 62, "abc")); }),
                 "key 'x.bytes' claims 4611686018427387904 elements");
  expect_refused("f64_array_past_end", edit([](Gguf &g) {
                   g.set(kv_arr("x.doubles", F64, 1000000, std::string(8, '\0')));
                 }),
                 "claims 1000000 elements of type f64 (at least 8000000 bytes)");
  expect_refused(
      "key_length_2_63",
      [] {
        Gguf g = good_llama();
        std::string b = g.bytes();
        const uint64_t huge = uint64_t(1) << 63;
        std::memcpy(&b[24], &huge, 8); // the length of the first key
        return b;
      }(),
      "the name of key #0 is 9223372036854775808 bytes long");
  expect_refused(
      "key_length_past_end",
      [] {
        std::string b = good_llama().bytes();
        const uint64_t len = b.size(); // more than what follows
        std::memcpy(&b[24], &len, 8);
        return b;
      }(),
      "the name of key #0 claims");
  expect_refused("string_value_2_40", edit([](Gguf &g) {
                   g.set({"general.name", STR, raw<uint64_t>(uint64_t(1) << 40) + "abc"});
                 }),
                 "the value of key 'general.name' is 1099511627776 bytes long");
  expect_refused("string_value_past_end", edit([](Gguf &g) {
                   g.set({"general.name", STR, raw<uint64_t>(100000) + "abc"});
                 }),
                 "the value of key 'general.name' claims 100000 bytes");
  expect_refused(
      "string_element_past_end", edit([](Gguf &g) {
        g.set(kv_arr("tokenizer.ggml.merges", STR, 2, gstr("a b") + raw<uint64_t>(1u << 30)));
      }),
      "element 1 of key 'tokenizer.ggml.merges' claims 1073741824 bytes");
  expect_refused("key_name_64k", edit([](Gguf &g) { g.set(kv_u32(std::string(70000, 'k'), 1)); }),
                 "is 70000 bytes long (at byte");
  expect_refused("empty_key", edit([](Gguf &g) { g.set(kv_u32("", 1)); }), "has an empty name");
  expect_refused("duplicate_key",
                 edit([](Gguf &g) { g.kvs.push_back(kv_u32("llama.block_count", 2)); }),
                 "key 'llama.block_count' appears twice");
}

TEST(MalformedGguf, Alignment) {
  expect_refused("alignment_0", edit([](Gguf &g) { g.set(kv_u32("general.alignment", 0)); }),
                 "'general.alignment' = 0 is not a power of two");
  expect_refused("alignment_3", edit([](Gguf &g) { g.set(kv_u32("general.alignment", 3)); }),
                 "'general.alignment' = 3 is not a power of two");
  // A valid but unusual alignment: the tensor offsets must follow it.
  expect_refused("alignment_64_offsets_32", edit([](Gguf &g) {
                   g.kvs.insert(g.kvs.begin(), kv_u32("general.alignment", 64));
                 }),
                 "is not a multiple of the alignment 64");
  expect_refused("alignment_2_31", edit([](Gguf &g) {
                   g.kvs.insert(g.kvs.begin(), kv_u32("general.alignment", 1u << 31));
                   g.tensors.erase(g.tensors.begin() + 1, g.tensors.end());
                 }),
                 "the tensor data would start at byte 2147483648, past the end of the file");
}

TEST(MalformedGguf, Tensors) {
  expect_refused("dim_negative", edit([](Gguf &g) {
                   g.tensor("output.weight")->dims = {8, -40};
                 }),
                 "tensor 'output.weight' dimension 1 is negative (-40)");
  expect_refused("dim_int64_min", edit([](Gguf &g) {
                   g.tensor("output_norm.weight")->dims = {std::numeric_limits<int64_t>::min()};
                 }),
                 "tensor 'output_norm.weight' dimension 0 is negative");
  expect_refused("dim_zero", edit([](Gguf &g) {
                   g.tensor("blk.0.attn_k.weight")->dims = {8, 0};
                 }),
                 "tensor 'blk.0.attn_k.weight' has shape");
  expect_refused("five_dims", edit([](Gguf &g) {
                   g.tensor("output_norm.weight")->dims = {8, 1, 1, 1, 1};
                 }),
                 "tensor 'output_norm.weight' has 5 dimensions; at most 4");
  expect_refused(
      "n_dims_huge",
      [] {
        Gguf g = good_llama();
        g.tensors.erase(g.tensors.begin() + 1, g.tensors.end());
        std::string b = g.bytes();
        const size_t at = b.find("token_embd.weight") + 17;
        const uint32_t n = 0xFFFFFFFFu;
        std::memcpy(&b[at], &n, 4);
        return b;
      }(),
      "tensor 'token_embd.weight' has 4294967295 dimensions");
  expect_refused("elements_overflow", edit([](Gguf &g) {
                   g.tensor("output_norm.weight")->dims = {int64_t(1) << 32, int64_t(1) << 32, 4};
                 }),
                 "tensor 'output_norm.weight' has shape [4294967296, 4294967296, 4], whose element "
                 "count overflows 64 bits");
  expect_refused("elements_2_62", edit([](Gguf &g) {
                   g.tensors.erase(g.tensors.begin() + 1, g.tensors.end());
                   g.tensors[0].dims = {int64_t(1) << 31, int64_t(1) << 31};
                 }),
                 "tensor 'token_embd.weight' has 4611686018427387904 elements, more than 2^60");
  expect_refused("vocab_dim_2_40", edit([](Gguf &g) {
                   g.tensors.erase(g.tensors.begin() + 1, g.tensors.end());
                   g.tensors[0].dims = {8, int64_t(1) << 40};
                   g.data = false;
                 }),
                 "tensor 'token_embd.weight' has shape [8, 1099511627776], expected [8, n_vocab]");
  expect_refused("type_removed_q4_2", edit([](Gguf &g) { g.tensor("output.weight")->type = 4; }),
                 "tensor 'output.weight' has unknown ggml type 4");
  expect_refused("type_99", edit([](Gguf &g) { g.tensor("output.weight")->type = 99; }),
                 "tensor 'output.weight' has unknown ggml type 99");
  expect_refused("type_negative", edit([](Gguf &g) { g.tensor("output.weight")->type = -1; }),
                 "has unknown ggml type -1");
  expect_refused(
      "q8_0_row_not_blocks",
      edit([](Gguf &g) { g.tensor("output.weight")->type = GGML_TYPE_Q8_0; }),
      "tensor 'output.weight' has 8 elements per row, not a multiple of q8_0's block of 32");
  expect_refused("norm_not_f32",
                 edit([](Gguf &g) { g.tensor("output_norm.weight")->type = GGML_TYPE_F16; }),
                 "tensor 'output_norm.weight' is f16, expected f32");
  expect_refused("i32_matrix",
                 edit([](Gguf &g) { g.tensor("blk.0.attn_q.weight")->type = GGML_TYPE_I32; }),
                 "which ggml's CPU backend cannot multiply");
  expect_refused("offset_outside_file",
                 edit([](Gguf &g) { g.tensor("output.weight")->offset = uint64_t(1) << 40; }),
                 "tensor 'output.weight' data offset 1099511627776 should be");
  expect_refused("offset_u64_max",
                 edit([](Gguf &g) { g.tensor("output.weight")->offset = ~0ull - 31; }),
                 "tensor 'output.weight' data offset 18446744073709551584 should be");
  expect_refused("offset_misaligned", edit([](Gguf &g) { g.tensor("output.weight")->offset = 3; }),
                 "tensor 'output.weight' data offset 3 is not a multiple of the alignment 32");
  expect_refused("offsets_overlap", edit([](Gguf &g) { g.tensor("output.weight")->offset = 0; }),
                 "tensor 'output.weight' data offset 0 should be");
  expect_refused("duplicate_tensor", edit([](Gguf &g) {
                   g.tensors.push_back({"output_norm.weight", {8}});
                 }),
                 "tensor 'output_norm.weight' appears twice");
  // ggml cuts names at the first NUL: these two would be one tensor 'output' there (a gguf fuzz
  // finding: our check passed what ggml's parser refuses as a duplicate).
  expect_refused("tensor_names_equal_up_to_a_nul", edit([](Gguf &g) {
                   g.tensor("output.weight")->name = std::string("output\0weight", 13);
                   g.tensor("output_norm.weight")->name = std::string("output\0norm.weight", 18);
                 }),
                 "tensor 'output?norm.weight' has a NUL byte in its name (at byte");
  expect_refused("key_name_with_a_nul", edit([](Gguf &g) {
                   g.set(kv_str(std::string("general.alignment\0x", 19), "text"));
                 }),
                 "key 'general.alignment?x' has a NUL byte in its name");
  expect_refused("empty_tensor_name", edit([](Gguf &g) {
                   g.tensors.push_back({"", {8}});
                 }),
                 "has an empty name");
  expect_refused("tensor_name_64", edit([](Gguf &g) {
                   g.tensors.push_back({std::string(64, 't'), {8}});
                 }),
                 "is 64 bytes long (at byte");
  expect_refused("missing_tensor", edit([](Gguf &g) {
                   std::erase_if(g.tensors,
                                 [](const Tensor &t) { return t.name == "blk.0.ffn_up.weight"; });
                 }),
                 "tensor 'blk.0.ffn_up.weight' is missing");
  expect_refused("no_tensors", edit([](Gguf &g) { g.tensors.clear(); }),
                 "tensor 'token_embd.weight' is missing");
}

// Used or refused (docs/model-files.md): a tensor no graph reads, an optional tensor of the wrong
// shape for its role, a key whose value asks for a computation offgraph does not have, a key it
// does not know. Each is refused with the names; neutral values of unknown keys load.
TEST(MalformedGguf, UsedOrRefused) {
  expect_refused("unknown_tensor", edit([](Gguf &g) {
                   g.tensors.push_back({"blk.0.mystery.weight", {8}});
                 }),
                 "1 tensor is not used by offgraph's llama graph: 'blk.0.mystery.weight'");
  expect_refused("unknown_tensors", edit([](Gguf &g) {
                   for (int i = 0; i < 10; ++i)
                     g.tensors.push_back({"extra." + std::to_string(i) + ".weight", {8}});
                 }),
                 "10 tensors are not used by offgraph's llama graph: 'extra.0.weight', "
                 "'extra.1.weight', 'extra.2.weight', 'extra.3.weight', 'extra.4.weight', "
                 "'extra.5.weight', 'extra.6.weight', 'extra.7.weight' and 2 more");
  expect_refused("bias_wrong_length", edit([](Gguf &g) {
                   g.tensors.push_back({"blk.0.attn_q.bias", {7}});
                 }),
                 "tensor 'blk.0.attn_q.bias' has shape [7], expected [8]");
  expect_refused("scale_not_scalar", edit([](Gguf &g) {
                   g.tensors.push_back({"blk.0.ffn_up.scale", {2}});
                 }),
                 "tensor 'blk.0.ffn_up.scale' has shape [2], expected [1]");
  expect_refused(
      "scale_without_weight", edit([](Gguf &g) {
        std::erase_if(g.tensors, [](const Tensor &t) { return t.name == "output.weight"; });
        g.tensors.push_back({"output.scale", {1}}); // a tied head has no scale of its own
      }),
      "'output' has a bias or scale but no 'output.weight'");
  // llama.cpp's loaders create no bias for the head: one in the file is refused as unread.
  expect_refused("head_bias", edit([](Gguf &g) {
                   g.tensors.push_back({"output.bias", {40}});
                 }),
                 "1 tensor is not used by offgraph's llama graph: 'output.bias'");
  expect_refused("input_scale_not_scalar", edit([](Gguf &g) {
                   g.tensors.push_back({"blk.0.attn_v.input_scale", {4}});
                 }),
                 "tensor 'blk.0.attn_v.input_scale' has shape [4], expected [1]");
  expect_refused("fused_and_separate", edit([](Gguf &g) {
                   g.tensors.push_back({"blk.0.attn_qkv.weight", {8, 16}});
                 }),
                 "'blk.0.attn_qkv.weight' and separate q/k/v weights: one or the other");
  expect_refused("fused_with_two_biases", edit([](Gguf &g) {
                   std::erase_if(g.tensors, [](const Tensor &t) {
                     return t.name == "blk.0.attn_q.weight" || t.name == "blk.0.attn_k.weight" ||
                            t.name == "blk.0.attn_v.weight";
                   });
                   g.tensors.push_back({"blk.0.attn_qkv.weight", {8, 16}});
                   g.tensors.push_back({"blk.0.attn_q.bias", {8}});
                   g.tensors.push_back({"blk.0.attn_k.bias", {4}});
                 }),
                 "needs its own bias, or all three of attn_q/k/v.bias");
  expect_refused("rope_scaling_yarn",
                 edit([](Gguf &g) { g.set(kv_str("llama.rope.scaling.type", "yarn")); }),
                 "key 'llama.rope.scaling.type' = 'yarn' is not supported");
  expect_refused(
      "attention_softcap",
      edit([](Gguf &g) { g.set(kv_f32("llama.attn_logit_softcapping", 20.0f)); }),
      "key 'llama.attn_logit_softcapping' = 20 is not something offgraph's llama computes");
  expect_refused("not_causal", edit([](Gguf &g) { g.set(kv_u32("llama.attention.causal", 0)); }),
                 "key 'llama.attention.causal' = 0 is not something offgraph's llama computes");
  expect_refused("embedding_scale",
                 edit([](Gguf &g) { g.set(kv_f32("llama.embedding_scale", 12.0f)); }),
                 "key 'llama.embedding_scale' = 12");
  expect_refused("unknown_namespace",
                 edit([](Gguf &g) { g.set(kv_u32("clip.vision.block_count", 24)); }),
                 "key 'clip.vision.block_count' = 24 belongs to no reader offgraph has");
  expect_refused("vocab_size_disagrees",
                 edit([](Gguf &g) { g.set(kv_u32("llama.vocab_size", 41)); }),
                 "key 'llama.vocab_size' = 41 but token_embd.weight has 40 rows");
  expect_refused("split_part", edit([](Gguf &g) { g.set(kv_u32("split.count", 3)); }),
                 "this is one part of a split model (split.count = 3)");
  expect_refused("swa_head_size",
                 edit([](Gguf &g) { g.set(kv_u32("llama.attention.key_length_swa", 2)); }),
                 "key 'llama.attention.key_length_swa' = 2 differs from the other layers' 4");
  expect_refused("pooling_near_unspecified",
                 edit([](Gguf &g) { g.set(kv_u32("llama.pooling_type", 4294967294u)); }),
                 "key 'llama.pooling_type' = 4294967294");
  expect_refused("array_not_neutral", edit([](Gguf &g) {
                   g.set(
                       kv_arr("llama.swiglu_clamp_exp", F32, 3, raw(0.0f) + raw(7.0f) + raw(0.0f)));
                 }),
                 "key 'llama.swiglu_clamp_exp' = [3 x f32: 0, 7, 0]");
  expect_refused("moe", edit([](Gguf &g) { g.set(kv_u32("llama.expert_count", 8)); }),
                 "mixture-of-experts llama files are not supported");
  // Neutral values ask for nothing: the file loads.
  Gguf neutral = edit([](Gguf &g) {
    g.set(kv_f32("llama.attn_logit_softcapping", 0.0f));
    g.set(kv_u32("llama.attention.causal", 1));
    g.set(kv_str("llama.rope.scaling.type", "linear"));
    g.set(kv_u32("llama.expert_count", 0));
    g.set(kv_u32("quantize.imatrix.chunks_count", 100));
    g.set(kv_u32("split.count", 1));
    g.set(kv_u32("llama.pooling_type", 4294967295u)); // llama.cpp's saver: unspecified
    g.set(kv_strs("llama.classifier.output_labels", {"", ""}));
    g.set(kv_arr("llama.swiglu_clamp_exp", F32, 2, raw(0.0f) + raw(0.0f)));
    g.tensors.push_back({"blk.0.attn_q.input_scale", {1}}); // counted, not applied
  });
  const fs::path path = corpus_dir() / "neutral_keys.gguf";
  std::ofstream(path, std::ios::binary) << neutral.bytes();
  expect_clean(isolated([&] { return load_everything(path.string()); }), "neutral_keys.gguf");
}

// Byte mutations of the header, metadata and tensor table: each byte set to 0x00, 0xFF, 0x80
// and +1 in turn. Each file loads or is refused with a message; none crashes or allocates much.
TEST(MalformedGguf, MutatedBytes) {
  Gguf meta = good_llama();
  meta.data = false;
  const std::string good = good_llama().bytes();
  const size_t data_at = meta.bytes().size();
  size_t refused = 0, loaded = 0;
  const Isolated r = isolated([&] {
    size_t n_refused = 0, n_loaded = 0;
    for (size_t at = 0; at < data_at; ++at)
      for (int how = 0; how < 4; ++how) {
        std::string b = good;
        b[at] = how == 0 ? '\0' : how == 1 ? '\xff' : how == 2 ? '\x80' : char(b[at] + 1);
        if (b == good) continue;
        const MemFile f(b);
        const std::string err = load_everything(f.path());
        if (!err.empty() && err[0] == '\x01')
          return "byte " + std::to_string(at) + " mutation " + std::to_string(how) + ": " +
                 err.substr(1);
        (err.empty() ? n_loaded : n_refused) += 1;
      }
    return "\x02" + std::to_string(n_refused) + " " + std::to_string(n_loaded);
  });
  ASSERT_FALSE(r.report.empty());
  ASSERT_EQ(r.report[0], '\x02') << r.report;
  std::sscanf(r.report.c_str() + 1, "%zu %zu", &refused, &loaded);
  Isolated clean = r;
  clean.report.clear();
  expect_clean(clean, "mutations");
  g_tried += refused + loaded;
  std::printf("[malformed] %zu byte mutations: %zu refused with a message, %zu still valid\n",
              refused + loaded, refused, loaded);
}

// The figure for docs/reliability.md, printed when the binary runs all tests in one process
// (build-*/bin/malformed_gguf_tests; ctest runs each test apart).
class Figures : public ::testing::Environment {
public:
  void TearDown() override {
    std::printf("[malformed] %zu malformed files tried: none crashed; peak memory grew by at most "
                "%ld KB (limit %ld MB)\n",
                g_tried, g_max_growth_kb, kMaxGrowthKb / 1024);
  }
};
const auto *const figures = ::testing::AddGlobalTestEnvironment(new Figures);

} // namespace
} // namespace offgraph::model
