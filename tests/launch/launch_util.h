// What the launcher tests share (launch_test.cpp: one node; launch_nodes_test.cpp: two "nodes" over
// loopback): running build/bin/launch, its children, and reading what the workers printed.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/process.h"
#include "tests/testutil.h"

namespace lm::launch_test {

namespace fs = std::filesystem;
using lm::test::bin_path;
using lm::test::free_port;
using lm::test::read_text;
using lm::test::RunResult;
using lm::test::TempDir;
using lm::test::write_text;
using Clock = std::chrono::steady_clock;

inline const std::string kWorker = bin_path("launch_fake_worker");

// `launch ARGS` without OMP_NUM_THREADS in its environment (plus `env` entries), stdout+stderr.
inline RunResult launch(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> a = {"-u", "OMP_NUM_THREADS"};
  a.insert(a.end(), env.begin(), env.end());
  a.push_back(bin_path("launch"));
  a.insert(a.end(), args.begin(), args.end());
  return lm::test::run_bin("/usr/bin/env", a);
}

// A launch process running in the background; stdout and stderr to files (one file if the same).
struct Child {
  lm::Process proc;
  std::string out, err;
};

inline Child start(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  lm::SpawnOptions so;
  so.argv = {bin_path("launch")};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.unset_env("OMP_NUM_THREADS");
  so.in = lm::Redirect::null();
  so.out = lm::Redirect::file(out, /*append=*/false);
  so.err = err == out ? lm::Redirect::to_stdout() : lm::Redirect::file(err, /*append=*/false);
  return Child{lm::Process::spawn(so), out, err};
}

// Exit code (128+signal if killed); SIGKILLs the child and returns -1 after `timeout_s`.
inline int finish(Child& c, double timeout_s = 60) {
  if (auto status = c.proc.wait_for(timeout_s)) return lm::exit_code(*status);
  c.proc.signal(SIGKILL);
  c.proc.wait();
  return -1;
}

inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

inline bool wait_until_count(const std::string& path, const std::string& what, size_t n, double timeout_s = 20) {
  auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < timeout_s) {
    if (count(read_text(path), what) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// rank -> (NAME -> value) from "[rank<r>]: ENV NAME=value" lines.
inline std::map<int, std::map<std::string, std::string>> envs_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int rank;
    char rest[4096];
    if (std::sscanf(line.c_str(), "[rank%d]: ENV %4095[^\n]", &rank, rest) != 2) continue;
    std::string kv = rest;
    auto eq = kv.find('=');
    m[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) v.push_back(l);
  return v;
}

// Whether `pid` still runs; a zombie does not (an orphan waits for whoever reaps it, maybe nobody).
inline bool process_exists(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  auto paren = stat.rfind(')');  // "pid (comm) S ..."
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// The pids a fake worker printed ("worker rank=R local_rank=L attempt=A pid=P").
inline std::map<int, pid_t> worker_pids(const std::string& out) {
  std::map<int, pid_t> m;
  for (auto& l : lines_of(out)) {
    auto p = l.find("worker rank=");
    if (p == std::string::npos) continue;
    int rank, local, attempt, pid;
    if (std::sscanf(l.c_str() + p, "worker rank=%d local_rank=%d attempt=%d pid=%d", &rank, &local, &attempt, &pid) == 4)
      m[rank] = pid;
  }
  return m;
}


// The workers' MASTER_PORT of each attempt from the launcher's "attempt <n>: started ranks ...,
// MASTER_PORT <p>" lines: attempt -> port.
inline std::map<int, int> master_ports(const std::string& out) {
  std::map<int, int> m;
  for (auto& l : lines_of(out)) {
    auto p = l.find("[launch] attempt ");
    int attempt, a, b, world, port;
    if (p != std::string::npos &&
        std::sscanf(l.c_str() + p, "[launch] attempt %d: started ranks %d-%d of %d, MASTER_PORT %d", &attempt, &a, &b,
                    &world, &port) == 5)
      m[attempt] = port;
  }
  return m;
}


}  // namespace lm::launch_test
