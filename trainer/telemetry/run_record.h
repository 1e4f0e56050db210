// RUN_DIR/meta.json: how to reproduce a run and how it ended. Written by rank 0 at start (status
// "running") and rewritten at the end (completed / stopped / failed, exit code, error, end time).
// Earlier attempts of the same run directory (resumes) are kept in "attempts".
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "data/loader/loader.h"
#include "trainer/runtime/device.h"

namespace lm {

// What meta.json records about a run besides its status.
struct RunFacts {
  std::string command;
  nlohmann::json config;     // the resolved config as JSON
  data::TrainData data;      // the training data (its mixture: null for data.train)
  GpuInfo gpu;               // empty model on CPU
  int world_size = 1;
  std::string launch;        // torchrun | slurm | single
  int64_t params = 0;
  double flops_per_token = 0;
  nlohmann::json schedule;   // the learning-rate schedule (LrSchedule::record())
  nlohmann::json parallelism;  // the parallelism strategy and its facts (Parallelism::record())
};
// meta.json's facts: code, command, cwd, config, data, host, GPU, LibTorch, world, parallelism,
// model, schedule.
nlohmann::json describe_run(const RunFacts& f);
// nvidia-smi's view of the GPUs into RUN_DIR/logs/nvidia-smi_<when>.rank<r>.txt (call on CUDA only).
void nvidia_smi_snapshot(const std::string& run_dir, const std::string& when, int rank);

// hostname, CPU model and cores, memory: {"hostname", "cpu_model", "cpu_cores", "memory_gb"}.
nlohmann::json host_info();
// Everything outside the config that changes the numbers a CPU run computes: LibTorch's intra- and
// inter-op thread counts, the BLAS libraries loaded (real paths: Debian's alternatives pick one),
// OpenBLAS's build config, core type and thread count, and every OMP_/MKL_/OPENBLAS_/GOTO_/KMP_/
// BLIS_/VECLIB_/ATEN_/TORCH_ environment variable (replay them to rerun bit-exactly, docs/runs.md).
nlohmann::json numerics_info();
// Now as "2026-11-30T01:23:45Z".
std::string utc_now();

class RunRecord {
 public:
  // meta: the run's facts (code, command, config, data, hardware...); start_time, status and the
  // previous attempts are added here.
  RunRecord(const std::string& run_dir, nlohmann::json meta);
  // Final status: "completed", "stopped" (signal) or "failed" (with the error's message).
  void finish(const std::string& status, int exit_code, const std::string& error = "");

 private:
  void write();
  std::string path_;
  nlohmann::json meta_;
};

}  // namespace lm
