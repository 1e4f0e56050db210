// Step statistics over ranks (see step_stats.h).
#include "trainer/parallel/step_stats.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "common/checksum.h"
#include "common/log.h"
#include "trainer/comm/process_group.h"

namespace lm {
namespace {

enum Stat { kLossSum, kTargets, kPad, kInputs, kWaitUs, kStop, kSave, kHash, kZLossSum, kNumStats };

int64_t double_bits(double d) {
  int64_t i;
  std::memcpy(&i, &d, sizeof i);
  return i;
}
double bits_double(int64_t i) {
  double d;
  std::memcpy(&d, &i, sizeof d);
  return d;
}

}  // namespace

GlobalStats gather_step_stats(const RankStats& mine, Comm* comm, int world, int64_t step) {
  int64_t local[kNumStats] = {double_bits(mine.loss_sum), mine.targets, mine.pad, mine.inputs,
                              static_cast<int64_t>(mine.wait_ms * 1e3), mine.stop, mine.save,
                              static_cast<int64_t>(mine.hash), double_bits(mine.z_loss_sum)};
  std::vector<int64_t> all(local, local + kNumStats);
  if (comm) {
    auto t = torch::from_blob(local, {kNumStats}, torch::kLong).clone();
    auto g = comm->all_gather(t, strf("all-gather of step %lld statistics", (long long)step)).contiguous();
    all.assign(g.data_ptr<int64_t>(), g.data_ptr<int64_t>() + g.numel());
  }
  GlobalStats out;
  double loss_total = 0, z_total = 0;
  std::vector<uint64_t> hashes;
  for (int r = 0; r < world; ++r) {
    const int64_t* s = &all[static_cast<size_t>(r) * kNumStats];
    loss_total += bits_double(s[kLossSum]);
    z_total += bits_double(s[kZLossSum]);
    out.targets += s[kTargets], out.pad += s[kPad], out.inputs += s[kInputs];
    out.wait_max_ms = std::max(out.wait_max_ms, s[kWaitUs] / 1e3);
    out.stop |= s[kStop] != 0;
    hashes.push_back(static_cast<uint64_t>(s[kHash]));
  }
  out.save = all[kSave] != 0;  // rank 0 decides
  out.loss = loss_total / std::max<double>(1.0, static_cast<double>(out.targets));
  out.z_loss = z_total / std::max<double>(1.0, static_cast<double>(out.targets));
  out.batch_hash = world == 1 ? hashes[0] : xxh64(hashes.data(), hashes.size() * sizeof(uint64_t));
  return out;
}

double global_target_tokens(int64_t local, bool packed, Comm* comm, int world) {
  if (!comm) return static_cast<double>(std::max<int64_t>(local, 1));
  if (packed) return static_cast<double>(local) * world;
  auto t = torch::tensor({local}, torch::kLong);
  comm->all_reduce_sum(t, "all-reduce of the step's token count");
  return static_cast<double>(std::max<int64_t>(t.item<int64_t>(), 1));
}

}  // namespace lm
