// Launch contract, process group and bucketed gradient all-reduce (see dist.h).
#include "trainer/dist/dist.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "common/compat.h"
#include "common/errors.h"
#include "common/log.h"
#include "trainer/optim/optim.h"

namespace lm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 30))
    throw UsageError(std::string("environment variable ") + name + "='" + v + "' is not a non-negative integer");
  return static_cast<int>(x);
}

// First host of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      size_t j = i + 1;
      while (j < list.size() && std::isdigit(static_cast<unsigned char>(list[j]))) host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

// First line of an exception message (c10 errors carry backtraces).
std::string first_line(const std::exception& e) {
  std::string m = e.what();
  auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv e;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.source = "torchrun";
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
    e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent && std::string(agent) == "True";
  } else if (env("SLURM_PROCID") && env_int("SLURM_NTASKS", 1) > 1) {
    e.source = "slurm";
    e.rank = env_int("SLURM_PROCID", 0);
    e.world_size = env_int("SLURM_NTASKS", 1);
    e.local_rank = env_int("SLURM_LOCALID", 0);
    e.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 0);
    if (e.local_world_size == 0 && env("SLURM_TASKS_PER_NODE"))  // "4(x2)" -> 4
      e.local_world_size = std::atoi(env("SLURM_TASKS_PER_NODE"));
    if (e.local_world_size == 0) e.local_world_size = 1;
    e.restart_count = env_int("SLURM_RESTART_COUNT", 0);
  } else {
    return e;
  }
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw UsageError("rank " + std::to_string(e.rank) + " is outside world size " + std::to_string(e.world_size));
  if (env("MASTER_ADDR")) e.master_addr = env("MASTER_ADDR");
  else if (e.source == "slurm" && env("SLURM_JOB_NODELIST")) e.master_addr = first_slurm_host(env("SLURM_JOB_NODELIST"));
  e.master_port = env_int("MASTER_PORT", 29500);
  if (e.world_size > 1 && e.master_addr.empty())
    throw UsageError("MASTER_ADDR is not set (needed for a world size of " + std::to_string(e.world_size) + ")");
  if (e.master_port < 1 || e.master_port > 65535)
    throw UsageError("environment variable MASTER_PORT=" + std::to_string(e.master_port) + " is not a port");
  return e;
}

// ---- Comm ------------------------------------------------------------------------------------

struct Comm::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CommBackend> pg;
  torch::Device device{torch::kCPU};  // where collective tensors must live
};

struct Comm::Pending {
  c10::intrusive_ptr<c10d::Work> work;
  torch::Tensor tensor;
};

Comm::Comm(const LaunchEnv& e, const DistConfig& cfg, const torch::Device& device)
    : impl_(std::make_unique<Impl>()), rank_(e.rank), world_(e.world_size), timeout_s_(cfg.timeout_s) {
  backend_ = cfg.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : cfg.backend;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1e3));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(e.master_port);
    so.isServer = !e.agent_store && e.rank == 0;
    so.numWorkers = e.agent_store ? c10::optional<size_t>() : c10::optional<size_t>(e.world_size);
    so.waitWorkers = false;
    so.timeout = timeout;
    so.multiTenant = true;
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, so);
    if (e.agent_store)
      store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(e.restart_count), store);
    impl_->store = c10::make_intrusive<c10d::PrefixStore>("lmtrain/", store);
  } catch (const std::exception& ex) {
    throw Error("rendezvous at " + e.master_addr + ":" + std::to_string(e.master_port) + " failed: " + first_line(ex));
  }
  if (backend_ == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    const char* ifname = env("GLOO_SOCKET_IFNAME");
    opts->devices.push_back(ifname ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    opts->threads = 2;
    try {
      impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, rank_, world_, opts);
    } catch (const std::exception& ex) {
      throw Error("creating the gloo process group failed: " + first_line(ex));
    }
  } else if (backend_ == "nccl") {
#if defined(USE_C10D_NCCL)
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, rank_, world_, opts);
    impl_->device = device;
#else
    throw ConfigError("key 'dist.backend': nccl requested but this LibTorch was built without NCCL");
#endif
  } else {
    throw ConfigError("key 'dist.backend': unknown backend '" + backend_ + "'");
  }
  barrier("startup barrier");
}

Comm::~Comm() {
#if defined(USE_C10D_NCCL) && LM_TORCH_AT_LEAST(2, 2)
  if (backend_ == "nccl" && impl_->pg) {
    try {
      static_cast<c10d::ProcessGroupNCCL*>(impl_->pg.get())->shutdown();
    } catch (...) {
    }
  }
#endif
}

std::shared_ptr<Comm::Pending> Comm::all_reduce_async(torch::Tensor t) {
  auto p = std::make_shared<Pending>();
  p->tensor = t;
  std::vector<torch::Tensor> ts{t};
  p->work = impl_->pg->allreduce(ts);
  return p;
}

void Comm::wait(const std::shared_ptr<Pending>& p, const std::string& what) {
  try {
    p->work->wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1e3)));
  } catch (const std::exception& ex) {
    throw Error("collective '" + what + "' failed on rank " + std::to_string(rank_) + " (timeout " +
                strf("%.0f", timeout_s_) + " s): " + first_line(ex));
  }
}

void Comm::all_reduce_sum(torch::Tensor& t, const std::string& what) {
  auto dev = t.to(impl_->device).contiguous();
  wait(all_reduce_async(dev), what);
  if (!dev.is_same(t)) t.copy_(dev);
}

void Comm::broadcast(torch::Tensor& t, int root, const std::string& what) {
  auto dev = t.to(impl_->device).contiguous();
  std::vector<torch::Tensor> ts{dev};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto p = std::make_shared<Pending>();
  p->work = impl_->pg->broadcast(ts, o);
  wait(p, what);
  if (!dev.is_same(t)) t.copy_(dev);
}

torch::Tensor Comm::all_gather(const torch::Tensor& t, const std::string& what) {
  auto in = t.to(impl_->device).contiguous();
  std::vector<torch::Tensor> outs;
  for (int r = 0; r < world_; ++r) outs.push_back(torch::empty_like(in));
  std::vector<std::vector<torch::Tensor>> out_lists{outs};
  std::vector<torch::Tensor> ins{in};
  auto p = std::make_shared<Pending>();
  p->work = impl_->pg->allgather(out_lists, ins);
  wait(p, what);
  return torch::cat(out_lists[0]).to(t.device());
}

void Comm::barrier(const std::string& what) {
  auto p = std::make_shared<Pending>();
  p->work = impl_->pg->barrier();
  wait(p, what);
}

// ---- GradSync --------------------------------------------------------------------------------

namespace {
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(std::function<void()> fn) : fn(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn();
    return outputs;
  }
  std::function<void()> fn;
};
}  // namespace

GradSync::GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb)
    : comm_(comm), flat_(flat) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / flat.grads().element_size()));
  const auto& entries = flat.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (buckets_.empty() || buckets_.back().numel + entries[i].numel > cap)
      buckets_.push_back({entries[i].offset, 0, 0, 0, nullptr});
    buckets_.back().numel += entries[i].numel;
    ++buckets_.back().pending_total;
    bucket_of_entry_.push_back(buckets_.size() - 1);
  }
  // One post-hook per parameter on its AccumulateGrad node: it fires once per backward, after the
  // gradient was added into the flat buffer.
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model.named_parameters()) by_name[p.key()] = p.value();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(by_name.at(entries[i].name));
    auto key = acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { ready(i); }));
    hooks_.emplace_back(acc, key);
  }
}

GradSync::~GradSync() {
  for (auto& [acc, key] : hooks_) static_cast<torch::autograd::Node*>(acc.get())->del_post_hook(key);
}

void GradSync::begin(bool sync) {
  active_ = sync;
  next_launch_ = 0;
  for (auto& b : buckets_) b.pending = b.pending_total, b.work = nullptr;
}

void GradSync::ready(size_t entry) {
  if (!active_) return;
  --buckets_[bucket_of_entry_[entry]].pending;
  launch_ready_in_order();
}

void GradSync::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    auto& b = buckets_[next_launch_++];
    b.work = comm_.all_reduce_async(flat_.grads().narrow(0, b.offset, b.numel));
  }
}

void GradSync::finish(int64_t step) {
  for (auto& b : buckets_) b.pending = 0;  // parameters that got no gradient this step
  launch_ready_in_order();
  for (size_t i = 0; i < buckets_.size(); ++i)
    comm_.wait(buckets_[i].work, strf("all-reduce of gradient bucket %zu/%zu at step %lld", i + 1,
                                      buckets_.size(), static_cast<long long>(step)));
  active_ = false;
}

}  // namespace lm
