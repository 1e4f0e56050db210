// spdlog-backed logging (see log.h). No torch headers here.
#include "common/log.h"

#include <spdlog/sinks/base_sink.h>
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

// The lines logged before the first log file opens (a process logs before it knows its run
// directory: a data cache warning, say), kept to be written into that file first.
class EarlyLines : public spdlog::sinks::base_sink<std::mutex> {
 public:
  struct Line {
    spdlog::log_clock::time_point time;
    spdlog::level::level_enum level;
    std::string text;
  };
  // Moves the kept lines into `file`, with their own times and levels.
  void replay_into(spdlog::sinks::sink& file) {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      for (const Line& l : lines_) file.log(spdlog::details::log_msg(l.time, {}, "lm", l.level, l.text));
      if (dropped_ > 0) {
        const std::string note = std::to_string(dropped_) + " more lines logged before this file opened were not kept";
        file.log(spdlog::details::log_msg(spdlog::log_clock::now(), {}, "lm", spdlog::level::warn, note));
      }
      file.flush();
    } catch (const std::exception& e) {  // as the logger's error handler: said, not thrown
      std::fprintf(stderr, "log: %s (the lines logged before the log file opened are not in it)\n", e.what());
    }
    lines_.clear();
    dropped_ = 0;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& m) override {
    if (lines_.size() < kMaxLines) lines_.push_back({m.time, m.level, std::string(m.payload.data(), m.payload.size())});
    else ++dropped_;
  }
  void flush_() override {}

 private:
  static constexpr size_t kMaxLines = 10000;
  std::vector<Line> lines_;
  size_t dropped_ = 0;
};

std::mutex g_mu;
std::shared_ptr<spdlog::logger> g_logger;
// Until the first log file opens (then null: the lines are in that file).
std::shared_ptr<EarlyLines> g_early = std::make_shared<EarlyLines>();
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
    std::vector<spdlog::sink_ptr> sinks{console};
    if (g_early) sinks.push_back(g_early);
    g_logger = std::make_shared<spdlog::logger>("lm", sinks.begin(), sinks.end());
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
  std::shared_ptr<EarlyLines> early;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    early = g_early;
    if (!file.empty()) g_early = nullptr;  // from here every line reaches a file
  }
  if (!file.empty()) {
    auto f = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
    f->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
    if (early) early->replay_into(*f);  // the lines logged before the file opened, first
    sinks.push_back(f);
  } else if (early) {
    sinks.push_back(early);  // still no file: keep them for the first one
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
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_logger = l;
  }
  // Lines another thread logged through the old logger while this one was being built.
  if (early && !file.empty()) early->replay_into(*sinks.back());
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
