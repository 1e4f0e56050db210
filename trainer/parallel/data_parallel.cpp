// One process, and plain data parallelism (see data_parallel.h).
#include "trainer/parallel/data_parallel.h"

#include "common/errors.h"
#include "common/log.h"

namespace lm {

std::string SingleProcess::describe(int64_t optimizer_bytes, const std::string& what) const {
  return strf("optimizer state %.1f MB: %s of every weight", optimizer_bytes / 1e6, what.c_str());
}

DataParallel::DataParallel(const ParallelInit& init)
    : comm_(*init.comm), flat_(init.flat), model_(init.model), bucket_mb_(init.dist.bucket_mb), rank_(init.rank),
      world_(init.world) {}

void DataParallel::start() {
  // A strategy keeping only its pieces of the weights (ZeRO-3) has nothing whole to broadcast: each
  // rank drew or restored its own pieces.
  if (!weights_part()) comm_.broadcast(flat_.params(), 0, "broadcast of the initial parameters");
  sync_ = std::make_unique<GradSync>(comm_, flat_, model_, plan_buckets(flat_, bucket_mb_), reduce(), reduce_name());
  log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm_.backend().c_str(), sync_->num_buckets(),
                 bucket_mb_));
}

nlohmann::json DataParallel::record() const {
  return {{"strategy", name()}, {"world_size", world_}, {"bucket_mb", bucket_mb_}, {"reduce", reduce_name()}};
}

std::string DataParallel::describe(int64_t optimizer_bytes, const std::string& what) const {
  return strf("optimizer state %.1f MB: %s of every weight%s", optimizer_bytes / 1e6, what.c_str(),
              world_ > 1 ? ", on every rank (dist.zero: 1 shards them)" : "");
}

}  // namespace lm
