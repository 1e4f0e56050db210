// Test helpers (see testutil.h).
#include "tests/testutil.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace lm::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/lmtest.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) std::abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (!std::getenv("LM_KEEP_TMP")) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

std::string bin_path(const std::string& name) {
  return name.find('/') == std::string::npos ? std::string(LM_BIN_DIR) + "/" + name : name;
}

std::string source_path(const std::string& rel) { return std::string(LM_SOURCE_DIR) + "/" + rel; }

static std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

RunResult run_bin(const std::string& bin, const std::vector<std::string>& args,
                  const std::string& stdin_text) {
  TempDir tmp;
  std::string cmd = shell_quote(bin_path(bin));
  for (auto& a : args) cmd += " " + shell_quote(a);
  if (!stdin_text.empty()) {
    write_text(tmp / "stdin", stdin_text);
    cmd += " < " + shell_quote(tmp / "stdin");
  } else {
    cmd += " < /dev/null";
  }
  cmd += " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  else if (WIFSIGNALED(st)) r.exit_code = 128 + WTERMSIG(st);
  return r;
}

void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string synthetic_corpus(int lines, unsigned seed) {
  static const char* words[] = {"and", "the", "lord", "said", "unto", "moses", "in", "beginning",
                                "god", "created", "heaven", "earth", "was", "without", "form",
                                "light", "darkness", "waters", "spirit", "upon", "face", "deep",
                                "day", "night", "evening", "morning", "first", "let", "there", "be"};
  std::mt19937 rng(seed);
  std::ostringstream out;
  for (int i = 0; i < lines; ++i) {
    int n = 4 + static_cast<int>(rng() % 16);
    for (int j = 0; j < n; ++j) out << (j ? " " : "") << words[rng() % (sizeof words / sizeof *words)];
    out << ".\n";
  }
  return out.str();
}

}  // namespace lm::test
