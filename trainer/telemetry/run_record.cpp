// meta.json (see run_record.h).
#include "trainer/telemetry/run_record.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <thread>

#include "data/loader/loader.h"

#include "common/build_info.h"
#include "common/torch/compat.h"
#include "common/files.h"
#include "common/log.h"
#include "common/process.h"
#include "run/run_dir.h"

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

namespace {

// Real paths of the loaded shared libraries whose file name contains `part` (e.g. "blas").
int collect_library(struct dl_phdr_info* info, size_t, void* out) {
  auto* libs = static_cast<std::vector<std::string>*>(out);
  const char* name = info->dlpi_name;
  if (name && std::strstr(name, "blas")) {
    char real[PATH_MAX];
    libs->push_back(::realpath(name, real) ? real : name);
  }
  return 0;
}

// OpenBLAS's own answers, found at run time (no link dependency; null when not OpenBLAS).
nlohmann::json openblas_info() {
  using Str = char* (*)();
  using Int = int (*)();
  auto config = reinterpret_cast<Str>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto core = reinterpret_cast<Str>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  auto threads = reinterpret_cast<Int>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!config || !core || !threads) return nullptr;
  return {{"config", config()}, {"core", core()}, {"threads", threads()}};
}

}  // namespace

nlohmann::json numerics_info() {
  std::vector<std::string> libs;
  ::dl_iterate_phdr(collect_library, &libs);
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    for (const char* prefix : {"OMP_", "MKL_", "OPENBLAS_", "GOTO_", "KMP_", "BLIS_", "VECLIB_", "ATEN_", "TORCH_"})
      if (key.rfind(prefix, 0) == 0) env[key] = kv.substr(kv.find('=') + 1);
  }
  return {{"torch_intra_op_threads", at::get_num_threads()}, {"torch_inter_op_threads", at::get_num_interop_threads()},
          {"blas_libraries", libs}, {"openblas", openblas_info()}, {"env", env}};
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
  const auto& m = f.data.sources.at(0);
  nlohmann::json where = nlohmann::json::array();  // where each source lives and which data it held
  for (const auto& s : f.data.sources)
    where.push_back({{"location", s.dir},
                     {"kind", s.source ? s.source->kind() : "local"},
                     {"data_version", s.data_version}});
  return {{"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}},
          {"command", f.command},
          {"cwd", ::getcwd(cwd, sizeof cwd) ? cwd : ""},
          {"config", f.config},
          {"data", {{"dir", m.dir},
                    {"data_version", f.data.version},
                    {"mixture", f.data.mixture},
                    {"tokenizer", {{"kind", m.tokenizer.kind}, {"vocab_size", m.tokenizer.vocab_size},
                                   {"hash", m.tokenizer.hash}}},
                    {"train_tokens", m.split_tokens("train")},
                    {"sources", where}}},
          {"host", host_info()},
          {"gpu", gpu},
          {"libtorch", compat::torch_version()},
          {"numerics", numerics_info()},
          {"world_size", f.world_size},
          {"launch", f.launch},
          {"parallelism", f.parallelism},
          {"model", {{"params", f.params}, {"flops_per_token", f.flops_per_token}}},
          {"schedule", f.schedule}};
}

void nvidia_smi_snapshot(const std::string& run_dir, const std::string& when, int rank) {
  const std::string out = run_dir::logs(run_dir) + "/nvidia-smi_" + when + ".rank" + std::to_string(rank) + ".txt";
  if (run_command({"nvidia-smi"}, out, nullptr, 30) != 0) log::warn("nvidia-smi failed: see " + out);
}

void RunRecord::write() { files::write_file_atomic(path_, meta_.dump(2) + "\n"); }

}  // namespace lm
