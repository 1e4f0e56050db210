// Step profiler (see profiler.h).
#include "trainer/telemetry/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/files.h"
#include "common/log.h"
#include "common/torch/compat.h"
#include "run/run_dir.h"
#include "trainer/runtime/device.h"

namespace lm {
namespace {

namespace autograd_prof = torch::autograd::profiler;
namespace prof_impl = torch::profiler::impl;

constexpr size_t kTopOps = 30;

// One timed event of a trace: the summary's input.
struct ProfiledEvent {
  std::string name;
  uint64_t thread = 0;  // CPU ops nest within their thread; device events never nest (0)
  double start_us = 0, dur_us = 0;
};
struct ProfiledTotal {
  int64_t calls = 0;
  double us = 0;
};

// Time per event name: on CPU the self time (an event's time minus the events nested directly in it
// on its thread), so that nothing counts twice; device events as they are.
std::map<std::string, ProfiledTotal> profiled_time_by_name(std::vector<ProfiledEvent> evs, bool nested) {
  std::map<std::string, ProfiledTotal> out;
  if (!nested) {
    for (const auto& e : evs) out[e.name].calls++, out[e.name].us += e.dur_us;
    return out;
  }
  std::sort(evs.begin(), evs.end(), [](const ProfiledEvent& a, const ProfiledEvent& b) {
    return std::make_tuple(a.thread, a.start_us, -a.dur_us) < std::make_tuple(b.thread, b.start_us, -b.dur_us);
  });
  struct Open {
    const ProfiledEvent* ev;
    double child_us;
  };
  std::vector<Open> stack;
  auto pop = [&] {
    auto& t = out[stack.back().ev->name];
    t.calls++, t.us += std::max(0.0, stack.back().ev->dur_us - stack.back().child_us);
    stack.pop_back();
  };
  for (const auto& e : evs) {
    while (!stack.empty() && (stack.back().ev->thread != e.thread ||
                              stack.back().ev->start_us + stack.back().ev->dur_us <= e.start_us))
      pop();
    if (!stack.empty()) stack.back().child_us += e.dur_us;
    stack.push_back({&e, 0.0});
  }
  while (!stack.empty()) pop();
  return out;
}

nlohmann::ordered_json profile_summary(const std::map<std::string, ProfiledTotal>& by_name, bool cuda, int64_t a, int64_t b) {
  std::vector<std::pair<std::string, ProfiledTotal>> sorted(by_name.begin(), by_name.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.us > y.second.us; });
  double total = 0;
  for (const auto& [name, t] : sorted) total += t.us;
  const std::string steps = strf("steps %lld-%lld (%lld steps)", (long long)a, (long long)b, (long long)(b - a + 1));
  nlohmann::ordered_json j = {
      {"device", cuda ? "cuda" : "cpu"},
      {"steps", {a, b}},
      {"window", cuda ? steps + ": the device time of each GPU kernel, memcpy and memset, summed over the steps; "
                                "total_us is their sum (GPU busy time, per stream; host time and idle gaps are not in it)"
                      : steps + ": the self time of each CPU op (its time minus the ops it calls), on every thread that "
                                "ran ops, summed over the steps; total_us is the sum over all ops (time in no op, such "
                                "as the trainer's own loops, is not in it)"},
      {"total_us", std::round(total * 10) / 10},
      {"top", nlohmann::ordered_json::array()}};
  for (size_t i = 0; i < sorted.size() && i < kTopOps; ++i) {
    const auto& [name, t] = sorted[i];
    // pct rounded down, so that the shares add up to at most 100
    j["top"].push_back({{"name", name}, {"calls", t.calls}, {"total_us", std::round(t.us * 10) / 10},
                        {"pct", total > 0 ? std::floor(t.us / total * 1e4) / 100 : 0.0}});
  }
  return j;
}

// The timed events of a ProfilerResult (Kineto): on a CUDA run its device-side events, else its CPU ops.
template <class Result>
std::vector<ProfiledEvent> kineto_profiled_events(const Result& result, bool cuda) {
  std::vector<ProfiledEvent> out;
  for (const auto& e : result.events()) {
    if ((e.deviceType() != c10::DeviceType::CPU) != cuda) continue;
    out.push_back({e.name(), cuda ? 0 : uint64_t(e.startThreadId()), compat::event_start_ns(e) / 1e3,
                   compat::event_duration_ns(e) / 1e3});
  }
  return out;
}

// The complete events ("ph": "X") of a Chrome trace file (the legacy recorder writes a JSON array).
std::vector<ProfiledEvent> chrome_trace_events(const std::string& path) {
  const auto trace = nlohmann::json::parse(files::read_file(path));
  const auto& list = trace.is_object() ? trace.at("traceEvents") : trace;
  std::vector<ProfiledEvent> out;
  for (const auto& e : list) {
    if (e.value("ph", "") != "X" || !e.contains("dur")) continue;
    const auto& tid = e.value("tid", nlohmann::json(0));
    out.push_back({e.value("name", ""), tid.is_number() ? tid.get<uint64_t>() : std::hash<std::string>()(tid.dump()),
                   e.value("ts", 0.0), e.value("dur", 0.0)});
  }
  return out;
}

std::set<prof_impl::ActivityType> profiler_activities(const c10::Device& device) {
  std::set<prof_impl::ActivityType> a = {prof_impl::ActivityType::CPU};
  if (device.is_cuda()) a.insert(prof_impl::ActivityType::CUDA);
  return a;
}

}  // namespace

struct StepProfiler::Recording {
  std::string tmp;                                       // the trace's temp name, renamed when complete
  std::unique_ptr<autograd_prof::RecordProfile> legacy;  // without Kineto
};

StepProfiler::StepProfiler(const std::string& range, const std::string& run_dir, int rank, const c10::Device& device)
    : device_(device) {
  if (range.empty() || !parse_step_range(range, &from_, &to_)) return;
  const std::string stem = run_dir::profile(run_dir) + "/" +
                           strf("steps_%lld-%lld.rank%d", (long long)from_, (long long)to_, rank);
  path_ = stem + ".trace.json";
  top_path_ = stem + ".top.json";
}

StepProfiler::~StepProfiler() {
  if (!rec_) return;
  // A run that ends inside the range: stop recording, keep no partial trace.
  try {
    if (compat::kHasKineto) autograd_prof::disableProfiler();
    rec_->legacy.reset();
  } catch (...) {
  }
  ::unlink(rec_->tmp.c_str());
}

void StepProfiler::before_step(int64_t step) {
  if (from_ == 0 || step + 1 != from_) return;
  files::make_dirs(path_.substr(0, path_.rfind('/')));
  rec_ = std::make_unique<Recording>();
  rec_->tmp = path_ + strf(".tmp.%d", (int)::getpid());
  if (compat::kHasKineto) {
    const prof_impl::ProfilerConfig config(prof_impl::ProfilerState::KINETO);
    autograd_prof::prepareProfiler(config, profiler_activities(device_));
    autograd_prof::enableProfiler(config, profiler_activities(device_));
  } else {
    rec_->legacy = std::make_unique<autograd_prof::RecordProfile>(rec_->tmp);
  }
}

void StepProfiler::after_step(int64_t step_done) {
  if (!rec_ || step_done != to_) return;
  try {  // a trace that cannot be written costs the trace, never the run
    finish();
  } catch (const std::exception& e) {
    rec_.reset();
    ::unlink((path_ + strf(".tmp.%d", (int)::getpid())).c_str());
    log::warn(strf("profile: steps %lld-%lld not written: %s; training goes on", (long long)from_, (long long)to_,
                   e.what()));
  }
}

void StepProfiler::finish() {
  const auto t0 = clock::Steady::now();
  const bool cuda = compat::kHasKineto && device_.is_cuda();  // the legacy recorder has CPU ops only
  std::vector<ProfiledEvent> events;
  if (compat::kHasKineto) {
    synchronize(device_);  // the range's kernels have run (as torch.profiler does on exit)
    auto result = autograd_prof::disableProfiler();
    result->save(rec_->tmp);
    events = kineto_profiled_events(*result, cuda);
  } else {
    rec_->legacy.reset();  // writes the trace
    events = chrome_trace_events(rec_->tmp);
  }
  if (const std::string err = files::try_rename(rec_->tmp, path_); !err.empty()) throw Error(err);
  rec_.reset();
  const auto top = profile_summary(profiled_time_by_name(std::move(events), !cuda), cuda, from_, to_);
  files::write_file_atomic(top_path_, top.dump(1) + "\n");
  std::string line;
  for (size_t i = 0; i < top["top"].size() && i < 5; ++i) {
    std::string name = top["top"][i]["name"];
    if (name.size() > 60) name = name.substr(0, 57) + "...";
    line += strf("%s%s %.1f%%", i ? ", " : "", name.c_str(), top["top"][i]["pct"].get<double>());
  }
  log::info(strf("profile: steps %lld-%lld in %s (%s, %.0f ms to write); top %s by %s time: %s", (long long)from_,
                 (long long)to_, path_.c_str(), compat::kHasKineto ? "Kineto" : "legacy profiler", clock::ms_since(t0),
                 cuda ? "GPU kernels" : "CPU ops", cuda ? "device" : "self", line.c_str()));
}

}  // namespace lm
