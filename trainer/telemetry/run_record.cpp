// meta.json (see run_record.h).
#include "trainer/telemetry/run_record.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>

#include "common/build_info.h"
#include "common/compat.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/run_dir.h"

namespace lm {

nlohmann::json host_info() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  double mem_gb = 0;
  std::ifstream mem("/proc/meminfo");
  for (std::string line; std::getline(mem, line);)
    if (line.rfind("MemTotal:", 0) == 0) mem_gb = std::atof(line.c_str() + 9) / 1048576.0;
  return {{"hostname", host}, {"cpu_model", cpu}, {"cpu_cores", std::thread::hardware_concurrency()},
          {"memory_gb", static_cast<double>(static_cast<int64_t>(mem_gb * 10)) / 10}};
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

RunRecord::RunRecord(const std::string& run_dir, nlohmann::json meta)
    : path_(run_dir::meta(run_dir)), meta_(std::move(meta)) {
  nlohmann::json attempts = nlohmann::json::array();
  if (files::exists(path_)) {
    auto old = nlohmann::json::parse(std::ifstream(path_), nullptr, /*allow_exceptions=*/false);
    if (old.is_object()) {
      if (old.contains("attempts")) attempts = old["attempts"];
      nlohmann::json attempt = nlohmann::json::object();
      for (const char* key : {"start_time", "end_time", "status", "exit_code", "error", "command"})
        attempt[key] = old.contains(key) ? old[key] : nlohmann::json(nullptr);
      attempts.push_back(attempt);
    }
  }
  meta_["format"] = "lmtrain-meta";
  meta_["version"] = 1;
  meta_["start_time"] = utc_now();
  meta_["end_time"] = nullptr;
  meta_["status"] = "running";
  meta_["exit_code"] = nullptr;
  meta_["attempts"] = attempts;
  write();
}

void RunRecord::finish(const std::string& status, int exit_code, const std::string& error) {
  meta_["end_time"] = utc_now();
  meta_["status"] = status;
  meta_["exit_code"] = exit_code;
  if (!error.empty()) meta_["error"] = error;
  write();
}

nlohmann::json describe_run(const RunFacts& f) {
  nlohmann::json gpu = nullptr;
  if (!f.gpu.model.empty())
    gpu = {{"model", f.gpu.model}, {"driver", f.gpu.driver}, {"cuda", f.gpu.cuda}, {"nccl", f.gpu.nccl}, {"count", f.gpu.count}};
  char cwd[4096] = {0};
  const auto& m = f.data;
  return {{"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}},
          {"command", f.command},
          {"cwd", ::getcwd(cwd, sizeof cwd) ? cwd : ""},
          {"config", f.config},
          {"data", {{"dir", m.dir}, {"data_version", m.data_version},
                    {"tokenizer", {{"kind", m.tokenizer.kind}, {"vocab_size", m.tokenizer.vocab_size},
                                   {"hash", m.tokenizer.hash}}},
                    {"train_tokens", m.split_tokens("train")},
                    // Where each source lives and which data it held (remote ones: s3:// or http(s)://).
                    {"sources", nlohmann::json::array({{{"location", m.dir},
                                                        {"kind", !m.source ? "local" : m.dir.rfind("s3://", 0) == 0 ? "s3" : "http"},
                                                        {"data_version", m.data_version}}})}}},
          {"host", host_info()},
          {"gpu", gpu},
          {"libtorch", compat::torch_version()},
          {"world_size", f.world_size},
          {"launch", f.launch},
          {"model", {{"params", f.params}, {"flops_per_token", f.flops_per_token}}}};
}

void nvidia_smi_snapshot(const std::string& run_dir, const std::string& when, int rank) {
  const std::string out = run_dir::logs(run_dir) + "/nvidia-smi_" + when + ".rank" + std::to_string(rank) + ".txt";
  if (std::system(("nvidia-smi > '" + out + "' 2>&1").c_str()) != 0) log::warn("nvidia-smi failed: see " + out);
}

void RunRecord::write() { files::write_file_atomic(path_, meta_.dump(2) + "\n"); }

}  // namespace lm
