// Run statistics and the sweep's summary tables (see summary.h).
#include "launch/sweep/summary.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/files.h"
#include "common/log.h"
#include "run/run_dir.h"
#include "run/records.h"

namespace lm::sweep {
namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
  return o;
}

std::string status_text(const Run& r) {
  return r.status == "failed" ? "failed (" + r.exit_text + ")" : r.status;
}

// One metrics.jsonl record into `st` (train: steps, loss and tokens/s; val: the best val_loss).
void add_record(const nlohmann::json& j, RunStats& st, std::vector<double>& tps) {
  const std::string kind = j.value(records::kKind, "");
  if (kind == records::kTrain && j.contains(records::kStep)) {
    st.steps = j[records::kStep].get<int64_t>();
    // null when a step of the window was non-finite (run/records.h)
    st.train_loss = j.contains(records::kLoss) && j[records::kLoss].is_number() ? j[records::kLoss].get<double>() : NAN;
    if (j.contains(records::kTokensPerS)) tps.push_back(j[records::kTokensPerS].get<double>());
  } else if (kind == records::kVal && j.contains(records::kValLoss)) {
    const double v = j[records::kValLoss].is_number() ? j[records::kValLoss].get<double>() : NAN;
    if (std::isfinite(v) && (std::isnan(st.best_val) || v < st.best_val))
      st.best_val = v, st.best_val_step = j.value(records::kStep, int64_t{-1});
  }
}

std::string csv_text(const std::vector<Run>& runs, const std::vector<RunStats>& stats, const std::vector<size_t>& order,
                     const std::vector<std::string>& keys) {
  std::ostringstream csv;
  csv << "run";
  for (auto& k : keys) csv << "," << csv_field(k);
  csv << ",status,exit_code,steps,max_steps,final_train_loss,best_val_loss,best_val_step,mean_tokens_per_s,run_dir\n";
  for (size_t i : order) {
    const Run& r = runs[i];
    const RunStats& st = stats[i];
    csv << csv_field(r.name);
    for (auto& kv : r.axes) csv << "," << csv_field(kv.second);
    csv << "," << r.status << "," << (r.exit_code >= 0 ? std::to_string(r.exit_code) : "") << ","
        << (st.steps >= 0 ? std::to_string(st.steps) : "") << "," << r.cfg.train.max_steps << ","
        << num(st.train_loss, "%.6g") << "," << num(st.best_val, "%.6g") << ","
        << (st.best_val_step >= 0 ? std::to_string(st.best_val_step) : "") << "," << num(st.tokens_per_s, "%.1f")
        << "," << csv_field(r.dir) << "\n";
  }
  return csv.str();
}

std::string md_text(const SweepSpec& s, const std::vector<Run>& runs, const std::vector<RunStats>& stats,
                    const std::vector<size_t>& order, const std::vector<std::string>& keys) {
  std::ostringstream md;
  md << "# Sweep " << s.dir << "\n\n";
  md << "Sweep file `" << s.path << "`, base `" << s.base << "`";
  if (!s.overrides.empty()) {
    md << ", fixed overrides:";
    for (auto& [k, v] : s.overrides) md << " `" << k << "=" << v << "`";
  }
  md << ". Sorted by best validation loss (runs without one last); tokens/s is the mean of the "
        "logged train windows after the first.\n\n";
  md << "| run |";
  for (auto& k : keys) md << " " << md_cell(k) << " |";
  md << " status | steps | final train loss | best val loss | tokens/s |\n|---|";
  for (size_t i = 0; i < keys.size(); ++i) md << "---|";
  md << "---|---:|---:|---:|---:|\n";
  for (size_t i : order) {
    const Run& r = runs[i];
    const RunStats& st = stats[i];
    const std::string steps = st.steps >= 0 ? std::to_string(st.steps) : "";
    md << "| " << md_cell(r.name) << " |";
    for (auto& kv : r.axes) md << " " << md_cell(kv.second) << " |";
    md << " " << status_text(r) << " | " << (steps.empty() ? "" : steps + "/" + std::to_string(r.cfg.train.max_steps))
       << " | " << num(st.train_loss, "%.4f") << " | " << num(st.best_val, "%.4f") << " | "
       << num(st.tokens_per_s, "%.0f") << " |\n";
  }
  return md.str();
}

}  // namespace

RunStats read_stats(const std::string& dir) {
  RunStats st;
  std::ifstream in(run_dir::metrics(dir));
  std::vector<double> tps;
  for (std::string line; std::getline(in, line);) {
    try {  // a line cut by a crash, or of another shape, is left out
      add_record(nlohmann::json::parse(line), st, tps);
    } catch (const nlohmann::json::exception&) {
    }
  }
  st.steps = std::max(st.steps, newest_checkpoint(dir));  // a stop checkpoints past the last log
  if (tps.size() > 1) tps.erase(tps.begin());
  if (!tps.empty()) {
    double sum = 0;
    for (double t : tps) sum += t;
    st.tokens_per_s = sum / static_cast<double>(tps.size());
  }
  return st;
}

std::string num(double v, const char* fmt) { return std::isfinite(v) ? strf(fmt, v) : ""; }

void write_summaries(const SweepSpec& s, const std::vector<Run>& runs) {
  std::vector<RunStats> stats;
  for (auto& r : runs) stats.push_back(read_stats(r.dir));
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    bool ha = std::isfinite(stats[a].best_val), hb = std::isfinite(stats[b].best_val);
    if (ha != hb) return ha;
    return ha && stats[a].best_val < stats[b].best_val;
  });
  std::vector<std::string> keys;
  for (auto& [k, v] : runs.front().axes) keys.push_back(k);
  files::write_file_atomic(s.dir + "/summary.csv", csv_text(runs, stats, order, keys));
  files::write_file_atomic(s.dir + "/summary.md", md_text(s, runs, stats, order, keys));
}

}  // namespace lm::sweep
