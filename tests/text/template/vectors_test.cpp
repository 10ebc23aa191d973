// Byte-for-byte comparison with Python Jinja2: every case in vectors/*.json was rendered by
// generate_vectors.py with Hugging Face's settings; the C++ engine must produce the same bytes, or
// fail where Python failed (with Python's message inside ours).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/template/chat_template.h"

namespace offgraph::text {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string id; // file stem + case name, usable as a gtest name
  std::string source;
  nlohmann::ordered_json context;
  nlohmann::ordered_json expected; // string, or null when an error is expected
  std::string expected_error;
};

std::string read_file(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string sanitize(const std::string &s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

std::vector<Case> load_cases() {
  std::vector<Case> cases;
  const fs::path dir = fs::path(OFFGRAPH_TEMPLATE_TEST_DIR);
  std::vector<fs::path> files;
  for (const auto &e : fs::directory_iterator(dir / "vectors"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto &f : files) {
    auto doc = nlohmann::ordered_json::parse(read_file(f));
    std::string shared_source;
    if (doc.contains("template"))
      shared_source = read_file(dir / doc["template"].get<std::string>());
    for (const auto &c : doc["cases"]) {
      Case k;
      k.id = sanitize(f.stem().string() + "__" + c["name"].get<std::string>());
      k.source = c.contains("template") ? c["template"].get<std::string>() : shared_source;
      k.context = c["context"];
      if (c.contains("expected")) k.expected = c["expected"];
      if (c.contains("expected_error")) k.expected_error = c["expected_error"].get<std::string>();
      cases.push_back(std::move(k));
    }
  }
  return cases;
}

// gtest prints parameters on failure; the id is enough.
void PrintTo(const Case &c, std::ostream *os) { *os << c.id; }

class PythonVectors : public ::testing::TestWithParam<Case> {};

TEST_P(PythonVectors, MatchesJinja2) {
  const Case &c = GetParam();
  ChatTemplateOptions options;
  std::tm now{};
  now.tm_year = 2026 - 1900;
  now.tm_mon = 2;
  now.tm_mday = 14;
  now.tm_hour = 9;
  now.tm_min = 26;
  now.tm_sec = 53;
  now.tm_wday = 6;
  now.tm_yday = 72;
  options.now = now;
  auto r = render_chat_template(c.source, c.context, options);
  if (c.expected.is_string()) {
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(*r, c.expected.get<std::string>());
  } else {
    ASSERT_FALSE(r.ok()) << "expected error: " << c.expected_error << "\ngot: " << *r;
    EXPECT_NE(r.message().find(c.expected_error), std::string::npos)
        << "python: " << c.expected_error << "\nours: " << r.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Jinja2, PythonVectors, ::testing::ValuesIn(load_cases()),
                         [](const ::testing::TestParamInfo<Case> &p) { return p.param.id; });

TEST(PythonVectorsCoverage, MuseHasAtLeastTwentyCases) {
  size_t muse = 0;
  for (const auto &c : load_cases()) muse += c.id.rfind("muse_glimmer__", 0) == 0;
  EXPECT_GE(muse, 20u);
}

} // namespace
} // namespace offgraph::text
