// Reading run directories for the report: one Run per directory, from metrics.jsonl (required),
// config.yaml, meta.json and summary.json (optional). File names are those of run/run_dir.h,
// metric names those of run/records.h. Torch-free.
//
// Reading metrics.jsonl: lines that are not JSON objects (a crash can cut the last one) are skipped
// and counted in the run's notes; unknown kinds and missing or null fields are skipped. Each series
// keeps the latest timeline: a "resume" record at step S drops the points after S (the resumed run
// logs them again), and a point at a step <= the previous point's replaces the points from that
// step on.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lm::report {

using json = nlohmann::ordered_json;

struct Point {
  double step, value;
};
using Series = std::vector<Point>;  // increasing step

// Flattened "section.key" -> value text, in file order.
using KV = std::vector<std::pair<std::string, std::string>>;

struct Event {
  double step;
  std::string kind, text;  // kind: records::kResume or records::kAnomaly
};

struct Run {
  std::string dir, name;                 // dir without trailing '/'; name: unique display name
  std::map<std::string, Series> series;  // metric name (records::kLoss, kValLoss, ...) -> points;
                                         // eval.tasks' scores under task_series(kTaskAcc, NAME), ...
  std::map<std::string, Series> source_tokens;  // data source -> its target tokens per logged window
  std::vector<Event> events;             // resumes and anomalies, in file order
  std::vector<double> ckpt_block_ms, ckpt_mb_per_s;
  double ckpt_mb = 0;
  KV config, meta;  // flattened config.yaml (or meta.json's copy of it) and meta.json
  bool has_config = false, has_meta = false;
  json meta_json, summary_json;  // null when absent
  int64_t bad_lines = 0;
  std::vector<int64_t> bad_line_numbers;   // the first few
  std::map<std::string, int64_t> ignored;  // records of unknown kinds (or without a step), by kind
  std::vector<std::string> notes;          // shown on the page under the runs table
};

// Reads the run directory `dir`. Throws DataError when `dir` is not a directory or has no
// metrics.jsonl; unreadable optional files and skipped records become Run::notes instead.
Run load_run(const std::string& dir);

// Gives the runs unique display names: the directory basename, or parent/basename when basenames
// collide, with " (2)", " (3)"... for what still collides.
void name_runs(std::vector<Run>& runs);

// The value of `key` in `kv`, or nullptr.
const std::string* kv_find(const KV& kv, const std::string& key);

// A JSON value as table text: strings bare, integral floats without ".0", the rest as JSON.
std::string compact(const json& v);

// The series name of task `task`'s field (records::kTaskAcc, kTaskAccNorm): "task_acc/NAME".
std::string task_series(const char* field, const std::string& task);

// The last point of the run's series `key`, or nullptr when it has none.
const Point* last_point(const Run& r, const char* key);

// True when `path` is a directory (following symlinks).
bool is_dir(const std::string& path);

}  // namespace lm::report
