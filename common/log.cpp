// spdlog-backed logging (see log.h). No torch headers here.
#include "common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdarg>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <utility>
#include <vector>

#include "common/errors.h"

namespace lm::log {
namespace {

std::mutex g_mu;
std::shared_ptr<spdlog::logger> g_logger;
bool g_hold = false;  // guarded by g_mu
std::vector<std::pair<spdlog::level::level_enum, std::string>> g_held;

// True when the line was held back (hold()).
bool held(spdlog::level::level_enum level, const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_hold) return false;
  g_held.emplace_back(level, msg);
  return true;
}

std::shared_ptr<spdlog::logger> logger() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_logger) {
    auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    console->set_pattern("%H:%M:%S %^%l%$ %v");
    g_logger = std::make_shared<spdlog::logger>("lm", console);
    g_logger->set_level(spdlog::level::info);
  }
  return g_logger;
}

}  // namespace

void init(const std::string& file, bool console, int rank, int world_size) {
  std::vector<spdlog::sink_ptr> sinks;
  if (console) {
    auto c = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    if (world_size > 1)
      c->set_pattern("%H:%M:%S %^%l%$ [rank " + std::to_string(rank) + "] %v");
    else
      c->set_pattern("%H:%M:%S %^%l%$ %v");
    sinks.push_back(c);
  }
  if (!file.empty()) {
    auto f = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
    f->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
    sinks.push_back(f);
  }
  auto l = std::make_shared<spdlog::logger>("lm", sinks.begin(), sinks.end());
  l->set_level(spdlog::level::debug);
  if (console && !sinks.empty()) sinks[0]->set_level(spdlog::level::info);
  l->flush_on(spdlog::level::info);
  // A log file that cannot be written (disk full) is said once, not once per line.
  l->set_error_handler([file](const std::string& msg) {
    static std::once_flag once;
    std::call_once(once, [&] { std::fprintf(stderr, "log: %s: %s (further log errors not shown)\n", file.c_str(), msg.c_str()); });
  });
  std::lock_guard<std::mutex> lock(g_mu);
  g_logger = l;
}

void debug(const std::string& msg) {
  if (!held(spdlog::level::debug, msg)) logger()->debug(msg);
}
void info(const std::string& msg) {
  if (!held(spdlog::level::info, msg)) logger()->info(msg);
}
void warn(const std::string& msg) {
  if (!held(spdlog::level::warn, msg)) logger()->warn(msg);
}
void error(const std::string& msg) { logger()->error(msg); }
void flush() { logger()->flush(); }

void hold() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hold = true;
}

void release() {
  std::vector<std::pair<spdlog::level::level_enum, std::string>> lines;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_hold = false;
    lines.swap(g_held);
  }
  for (const auto& [level, msg] : lines) logger()->log(level, msg);
}

void discard() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hold = false;
  g_held.clear();
}

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

}  // namespace lm::log
