// MFU peaks (see mfu.h).
#include "trainer/telemetry/mfu.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <string>

#include "common/errors.h"
#include "common/log.h"
#include "common/test_hooks.h"

namespace lm {

double builtin_peak_tflops(const std::string& gpu_model, const std::string& dtype) {
  struct Peak {
    std::vector<const char*> all_of;  // every substring must be in the device name (upper case)
    double bf16, fp32;                // dense tensor-core bf16; fp32 via TF32 tensor cores
  };
  // Vendor datasheets, dense (no sparsity: half the datasheets' "with sparsity" figures). The
  // first row whose parts are all in the name wins, so a board's own row comes before its
  // family's. H100: SXM5 ("H100 80GB HBM3", "H100 SXM5 80GB") 989/494, PCIe ("H100 PCIe") 756/378,
  // NVL ("H100 NVL") 835/418. H200: NVL ("H200 NVL") 835/418, SXM ("NVIDIA H200") 989/494; GH200
  // (Grace Hopper: the SXM-class GPU) 989/494. A100: SXM4 and PCIe ("A100-SXM4-80GB",
  // "A100-PCIE-40GB", "A100 80GB PCIe") share 312/156.
  static const std::vector<Peak> kPeaks = {
      {{"GH200"}, 989, 494},       {{"H200", "NVL"}, 835, 418},  {{"H200"}, 989, 494},
      {{"H100", "NVL"}, 835, 418}, {{"H100", "PCIE"}, 756, 378}, {{"H100", "SXM"}, 989, 494},
      {{"H100", "HBM3"}, 989, 494}, {{"A100"}, 312, 156}};
  std::string name = gpu_model;
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const auto& p : kPeaks) {
    bool all = true;
    for (const char* part : p.all_of) all = all && name.find(part) != std::string::npos;
    if (all) return dtype == "bf16" ? p.bf16 : p.fp32;
  }
  return 0;  // unknown, including an H100 name that does not say which board
}

namespace {
std::atomic<double> g_best_sgemm{0};  // the best measure_sgemm_flops() of this process
}  // namespace

double best_sgemm_flops() { return g_best_sgemm.load(); }

double measure_sgemm_flops(int64_t n, int min_reps, double min_seconds) {
  torch::NoGradGuard no_grad;
  // Deterministic inputs: drawing them would advance the global generator and shift every later
  // dropout draw (a resumed run, whose generator state was just restored, would then differ).
  auto a = torch::linspace(-1.0, 1.0, n * n).view({n, n}), b = a.t().contiguous(), c = torch::empty({n, n});
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  // Warm-up: threads started and spinning, pages touched, the clock ramped up: 2 products and 50 ms.
  const auto w0 = Clock::now();
  for (int r = 0; r < 2 || since(w0) < 0.05; ++r) torch::mm_out(c, a, b);
  double best = 1e30, total = 0;
  for (int r = 0; r < min_reps || total < min_seconds; ++r) {
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    const double s = since(t0);
    best = std::min(best, s);
    total += s;
  }
  const double flops = 2.0 * static_cast<double>(n * n * n) / best;
  for (double cur = g_best_sgemm.load(); flops > cur && !g_best_sgemm.compare_exchange_weak(cur, flops);) {
  }
  return flops;
}

MfuPeak mfu_peak(double peak_tflops, const std::string& gpu_model, const std::string& dtype, const torch::Device& device) {
  if (peak_tflops > 0) return {peak_tflops * 1e12, "log.peak_tflops"};
  if (device.is_cuda()) {
    const double p = builtin_peak_tflops(gpu_model, dtype);
    return {p * 1e12, "datasheet " + dtype + " peak of " + gpu_model};
  }
  // The test suite's hook (as LM_FAULT_* are): a fixed CPU peak instead of the start-up SGEMM
  // measurement, which costs each of the suite's hundreds of short trainer processes ~0.5 s. The
  // tests of the measured peak run without it.
  if (const double fixed = test_hooks().peak_tflops; fixed > 0) {
    return {fixed * 1e12, "LM_TEST_PEAK_TFLOPS (the test suite's fixed peak; nothing measured)"};
  }
  const double now = measure_sgemm_flops();
  MfuPeak p{std::max(now, best_sgemm_flops()),
            "CPU: SGEMM peak measured at start on this machine (torch::mm 1024^3 fp32, warmed up, best over 0.3 s) and "
            "again between steps, the best of this process kept (a rise is logged), not a vendor peak",
            true};
  p.measured_at = std::chrono::steady_clock::now();
  return p;
}

double MfuPeak::pct(double flops_per_s) {
  if (flops <= 0) return std::nan("");
  if (measured) {
    flops = std::max(flops, best_sgemm_flops());  // never below an SGEMM this process measured
    if (flops_per_s > flops && !beaten) {
      const double before = flops;
      beaten = true;  // once: a run that still beats it says so in its records
      refresh(0);
      log::warn(strf("MFU over 100%%: training ran at %.4g TFLOP/s, above the SGEMM peak (%.4g); measured again: "
                     "%.4g TFLOP/s is the peak from here", flops_per_s / 1e12, before / 1e12, flops / 1e12));
    }
  }
  return 100.0 * flops_per_s / flops;
}

bool MfuPeak::refresh(double min_interval_s) {
  if (!measured) return false;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - measured_at).count() < min_interval_s) return false;
  measure_sgemm_flops(1024, 3, 0.1);
  measured_at = std::chrono::steady_clock::now();
  const double before = flops;
  flops = std::max(flops, best_sgemm_flops());
  return flops > before;
}

}  // namespace lm
