// Servers for the remote-data tests, started on loopback and stopped by their destructors: nginx
// (Debian's, a non-daemon with a temporary prefix), s3rver (npm, in .deps/node from
// launch/dev/npm_deps.sh) and tests/fault_proxy.py; and a bytes dataset in many shards.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/files.h"
#include "tests/testutil.h"

namespace lm::test {

namespace fs = std::filesystem;

inline bool port_open(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// A server process, stopped by the destructor.
struct Server {
  Proc proc;
  int port = 0;
  bool up(double timeout_s = 20) {
    return wait_until(proc, [&] { return port > 0 && port_open(port); }, timeout_s);
  }
  ~Server() {
    kill_proc(proc, SIGTERM);
    wait_proc(proc, 10);
  }
};

inline std::string find_nginx() {
  for (const char* p : {"/usr/sbin/nginx", "/usr/bin/nginx"})
    if (fs::exists(p)) return p;
  return "";
}
inline std::string find_s3rver() {
  const std::string p = source_path(".deps/node/node_modules/.bin/s3rver");
  return fs::exists(p) ? p : "";
}

// nginx serving `root` (access log in tmp/nginx/access.log, with status codes).
inline std::unique_ptr<Server> start_nginx(const std::string& root, const std::string& tmp) {
  auto s = std::make_unique<Server>();
  const std::string prefix = tmp + "/nginx";
  files::make_dirs(prefix + "/logs");
  s->port = free_port();
  write_text(prefix + "/nginx.conf",
                   "daemon off;\nmaster_process off;\nworker_processes 1;\npid " + prefix + "/nginx.pid;\n"
                   "error_log " + prefix + "/logs/error.log;\nevents { worker_connections 256; }\n"
                   "http {\n  access_log " + prefix + "/access.log;\n  server {\n    listen 127.0.0.1:" +
                   std::to_string(s->port) + ";\n    root " + root + ";\n  }\n"
                   "  client_body_temp_path " + prefix + "/tmp1; proxy_temp_path " + prefix + "/tmp2;\n"
                   "  fastcgi_temp_path " + prefix + "/tmp3; uwsgi_temp_path " + prefix + "/tmp4;\n"
                   "  scgi_temp_path " + prefix + "/tmp5;\n}\n");
  s->proc = spawn_bin(find_nginx(), {"-p", prefix, "-c", prefix + "/nginx.conf", "-e", prefix + "/logs/error.log"},
                            prefix + "/stdout.log");
  return s;
}

// tests/fault_proxy.py in front of 127.0.0.1:upstream; its counts land in tmp/proxy_stats.json.
inline std::unique_ptr<Server> start_proxy(int upstream, const std::string& tmp, const std::vector<std::string>& args) {
  auto s = std::make_unique<Server>();
  const std::string port_file = tmp + "/proxy_port";
  std::vector<std::string> argv = {source_path("tests/fault_proxy.py"), "--upstream",
                                   "127.0.0.1:" + std::to_string(upstream), "--port-file", port_file,
                                   "--stats", tmp + "/proxy_stats.json"};
  argv.insert(argv.end(), args.begin(), args.end());
  s->proc = spawn_bin("/usr/bin/python3", argv, tmp + "/proxy.log");
  wait_until(s->proc, [&] { return fs::exists(port_file); }, 20);
  if (fs::exists(port_file)) s->port = std::stoi(read_text(port_file));
  return s;
}

// A bytes dataset of `lines` synthetic lines in shards of about `shard_tokens` tokens: DIR/data.
inline std::string make_dataset(const std::string& dir, int lines, int shard_tokens) {
  write_text(dir + "/corpus.txt", synthetic_corpus(lines));
  auto r = run_bin("prep", {dir + "/corpus.txt", "--out", dir + "/data", "--tokenizer", "bytes", "--shard-tokens",
                                  std::to_string(shard_tokens), "--val-fraction", "0.05", "--quiet"});
  if (r.exit_code != 0) throw std::runtime_error("prep failed: " + r.out);
  return dir + "/data";
}

// step -> batch_hash of the "train" records in a metrics.jsonl (runs that must see the same batches).
inline std::map<int64_t, std::string> step_batch_hashes(const std::string& metrics_path) {
  std::map<int64_t, std::string> h;
  for (const auto& line : metrics_of_kind(metrics_path, "train")) {
    auto j = nlohmann::json::parse(line);
    h[j.at("step").get<int64_t>()] = j.at("batch_hash").get<std::string>();
  }
  return h;
}

inline int count_in(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace lm::test
