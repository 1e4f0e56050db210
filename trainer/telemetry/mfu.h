// The MFU denominator: datasheet peaks of known GPUs, and on the CPU an SGEMM peak measured in the
// run (telemetry reads them; RunTelemetry computes MFU with them).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace lm {

// Dense peak TFLOP/s of one device for `dtype` ("bf16", "fp32") from a table of known GPUs, told
// apart by board from the device name, case-insensitive (H100 SXM, PCIe and NVL differ; H200 SXM
// and NVL differ; A100 SXM and PCIe agree), 0 when unknown (CPUs, other GPUs, an H100 whose name
// does not say the board).
double builtin_peak_tflops(const std::string& gpu_model, const std::string& dtype);
// Best fp32 matmul FLOP/s of this machine as LibTorch computes it now (torch::mm of n x n, after a
// warm-up of at least 2 products and 50 ms, the best of at least min_reps products and
// min_seconds), with the thread settings in effect. Best of a window, not of 3 products: on a
// shared host a 30 ms dip would otherwise be taken for the roof. Each result also raises
// best_sgemm_flops().
double measure_sgemm_flops(int64_t n = 1024, int min_reps = 5, double min_seconds = 0.3);
// The best measure_sgemm_flops() of this process so far (0 before the first).
double best_sgemm_flops();
// The MFU denominator in FLOP/s and where it comes from: log.peak_tflops when set (> 0); on CUDA the
// datasheet table; on CPU, where no vendor peak exists, the best SGEMM this process measured
// (labelled so). 0 when unknown.
struct MfuPeak {
  double flops = 0;
  std::string source;
  bool measured = false;  // the CPU's SGEMM measurement, not a given or datasheet figure
  bool beaten = false;    // a window ran above it once (and it was measured again then)
  std::chrono::steady_clock::time_point measured_at{};
  // MFU in % of a window's matmul FLOP/s (NaN when the peak is unknown). A measured peak is never
  // below best_sgemm_flops(): a start-up measurement on a busy host (seen: 38.8 GFLOP/s where the
  // roof is 70) is replaced by any better one. One that a window beats is measured again at once
  // (once) and logged.
  double pct(double flops_per_s);
  // A measured peak: measures SGEMM again (short: 3 products, 0.1 s) when min_interval_s have
  // passed since the last measurement, and keeps the best; true when the peak rose. The run calls
  // it between steps (RunTelemetry), so that a peak measured low at start does not inflate MFU.
  bool refresh(double min_interval_s);
};
MfuPeak mfu_peak(double peak_tflops, const std::string& gpu_model, const std::string& dtype, const torch::Device& device);

}  // namespace lm
