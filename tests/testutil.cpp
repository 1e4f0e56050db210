// Test helpers (see testutil.h).
#include "tests/testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

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

RunResult run_bin(const std::string& bin, const std::vector<std::string>& args,
                  const std::string& stdin_text) {
  TempDir tmp;
  SpawnOptions so;
  so.argv = {bin_path(bin)};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  if (!stdin_text.empty()) {
    write_text(tmp / "stdin", stdin_text);
    so.in = Redirect::file(tmp / "stdin", /*append=*/false);
  } else {
    so.in = Redirect::null();
  }
  so.out = Redirect::pipe();
  so.err = Redirect::to_stdout();
  RunResult r;
  Process p = Process::spawn(so);
  const int fd = p.take_stdout();
  std::array<char, 4096> buf;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) != 0;) {
    if (n > 0) r.out.append(buf.data(), static_cast<size_t>(n));
    else if (errno != EINTR) break;
  }
  ::close(fd);
  if (p.exec_errno()) r.out += "cannot execute " + so.argv[0] + ": " + std::strerror(p.exec_errno()) + "\n";
  r.exit_code = exit_code(p.wait());
  return r;
}

Proc spawn_bin(const std::string& bin, const std::vector<std::string>& args, const std::string& log,
               const std::vector<std::string>& env) {
  SpawnOptions so;
  so.argv = {bin_path(bin)};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  for (auto& e : env) {
    const auto eq = e.find('=');
    so.set_env(e.substr(0, eq), eq == std::string::npos ? "" : e.substr(eq + 1));
  }
  so.in = Redirect::null();
  so.out = Redirect::file(log, /*append=*/true);
  so.err = Redirect::to_stdout();
  return Proc{Process::spawn(so), log};
}

void kill_proc(const Proc& p, int sig) { p.process.signal(sig); }

int wait_proc(Proc& p, double timeout_s) {
  if (p.process.pid() <= 0) return -1;
  std::optional<int> st = p.process.wait_for(timeout_s);
  if (!st) {
    p.process.signal(SIGKILL);
    st = p.process.wait();
  }
  return exit_code(*st);
}

bool wait_until(const Proc& p, const std::function<bool()>& done, double timeout_s) {
  if (p.process.pid() <= 0) return false;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    if (done()) return true;
    if (!p.process.running()) return false;
    ::usleep(2000);
  }
  return false;
}

int64_t last_train_step(const std::string& metrics_path) {
  int64_t last = 0;
  if (!std::filesystem::exists(metrics_path)) return 0;  // polled before the run wrote it
  for (auto& line : metrics_of_kind(metrics_path, "train")) {
    auto p = line.find("\"step\":");
    if (p != std::string::npos) last = std::max<int64_t>(last, std::atoll(line.c_str() + p + 7));
  }
  return last;
}

void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  // A missing file is an error, not "": two missing files would otherwise compare equal.
  if (!in) throw std::runtime_error("read_text: cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> rank_env(int rank, int world, int port) {
  std::vector<std::string> env = {"OMP_NUM_THREADS=1"};
  if (world > 1)
    env.insert(env.end(), {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
                           "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)});
  return env;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string make_bytes_dataset(const std::string& dir, int lines) {
  write_text(dir + "/corpus.txt", synthetic_corpus(lines));
  auto r = run_bin("prep", {dir + "/corpus.txt", "--out", dir + "/data", "--tokenizer", "bytes",
                            "--val-fraction", "0.05", "--quiet"});
  if (r.exit_code != 0) throw std::runtime_error("prep failed: " + r.out);
  return dir + "/data";
}

const std::string& shared_bytes_dataset() {
  static TempDir dir;
  static const std::string data = make_bytes_dataset(dir.path());
  return data;
}

std::vector<std::string> metrics_of_kind(const std::string& path, const std::string& kind) {
  std::vector<std::string> out;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("metrics_of_kind: cannot open " + path);
  const std::string needle = "\"kind\":\"" + kind + "\"";
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
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

std::string python_torch_lacks_libuv(const std::string& out) {
  // "build without" in 2.6, "built without" in 2.14.
  if (out.find("use_libuv was requested but PyTorch was buil") == std::string::npos) return "";
  return "the Python peer (python3-torch without libuv) cannot rendezvous: its torchrun and agent-store clients "
         "ask for libuv whatever USE_LIBUV says (Debian's torch 2.6 and 2.14)";
}

}  // namespace lm::test
