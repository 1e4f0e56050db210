// Logging for every binary: a console sink on stderr and, optionally, one log file per rank.
//
// Implemented over spdlog in a translation unit that never includes a torch header (LibTorch 2.x
// ships a fmt that clashes with Debian's spdlog). Callers build messages with strf() or streams.
// Thread-safe.
#pragma once

#include <string>

namespace lm::log {

// (Re)configures the logger. `file` empty = console only. `console` false = file only.
// The console shows "[rank r]" when world_size > 1.
void init(const std::string& file = "", bool console = true, int rank = 0, int world_size = 1);
void debug(const std::string& msg);
void info(const std::string& msg);
void warn(const std::string& msg);
void error(const std::string& msg);
void flush();

// Holds debug, info and warn lines back (error lines are not held): a program that checks its
// inputs before it starts says nothing but its refusal when a check fails. release() writes the
// held lines, in order, through the logger as configured then (console and file) and stops holding;
// discard() drops them (the refusal says what matters) and stops holding.
void hold();
void release();
void discard();

// printf-style formatting into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace lm::log

namespace lm {
using log::strf;
}
