// The parallelism strategies by config (see parallel.h): the one table a new strategy is added to.
#include "trainer/parallel/parallel.h"

#include <functional>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/parallel/invariant.h"
#include "trainer/parallel/zero1.h"

namespace lm {
namespace {

struct Strategy {
  const char* name;
  // Whether it runs for this config and group (has_group: a process group exists).
  std::function<bool(const DistConfig&, int world, bool has_group)> applies;
  std::function<RankBytes(double n, double optimizer_per_param, int world)> bytes;
  std::function<std::unique_ptr<Parallelism>(const ParallelInit&)> make;
};

RankBytes replicated(double n, double opt, int) { return {4 * n, 4 * n, opt * n}; }

// In order: the first that applies runs.
const std::vector<Strategy>& strategies() {
  static const std::vector<Strategy> table = {
      {"invariant", [](const DistConfig& d, int, bool) { return d.invariant; }, replicated,
       [](const ParallelInit& in) { return std::make_unique<Invariant>(in); }},
      {"single", [](const DistConfig&, int, bool group) { return !group; }, replicated,
       [](const ParallelInit& in) { return std::make_unique<SingleProcess>(in); }},
      {"zero1", [](const DistConfig& d, int world, bool) { return d.zero == 1 && world > 1; },
       [](double n, double opt, int world) { return RankBytes{4 * n, 4 * n, opt * n / world}; },
       [](const ParallelInit& in) { return std::make_unique<Zero1>(in); }},
      {"data_parallel", [](const DistConfig&, int, bool) { return true; }, replicated,
       [](const ParallelInit& in) { return std::make_unique<DataParallel>(in); }},
  };
  return table;
}

const Strategy& pick(const DistConfig& dist, int world, bool has_group) {
  for (const auto& s : strategies())
    if (s.applies(dist, world, has_group)) return s;
  throw Error("no parallelism strategy applies");  // the last one always does
}

}  // namespace

torch::Tensor Parallelism::sum_losses(const std::vector<torch::Tensor>& losses) const {
  torch::Tensor sum = torch::zeros({}, (losses.empty() ? torch::TensorOptions() : losses[0].options()).dtype(torch::kFloat));
  for (const auto& l : losses) sum += l;
  return sum;
}

std::unique_ptr<Parallelism> make_parallelism(const ParallelInit& init) {
  return pick(init.dist, init.world, init.comm != nullptr).make(init);
}

RankBytes rank_bytes(const DistConfig& dist, int world, double n, double optimizer_per_param) {
  // Before the group exists: a group runs at world size > 1 (or a named backend, whose bytes are a
  // single process's all the same).
  return pick(dist, world, world > 1).bytes(n, optimizer_per_param, world);
}

}  // namespace lm
