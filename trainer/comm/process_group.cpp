// The process group and its collectives (see process_group.h).
#include "trainer/comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm {
namespace {

std::string first_line(const std::exception& e) {
  std::string m = e.what();
  auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

}  // namespace

struct Comm::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CommBackend> pg;
  torch::Device device{torch::kCPU};  // where collective tensors must live
};

struct Comm::Pending {
  c10::intrusive_ptr<c10d::Work> work;
  torch::Tensor tensor;
  torch::Tensor copy_from, copy_to;  // once done: copy_to.copy_(copy_from) (Gloo's reduce-scatter)
};

Comm::Comm(const LaunchEnv& e, const DistConfig& cfg, const torch::Device& device, const std::string& nccl_log_dir)
    : impl_(std::make_unique<Impl>()), rank_(e.rank), world_(e.world_size), timeout_s_(cfg.timeout_s) {
  backend_ = cfg.backend_auto() ? (device.is_cuda() ? "nccl" : "gloo") : cfg.backend;
  if (backend_ == "nccl" && !nccl_log_dir.empty()) {  // NCCL's own log, kept per rank with the run
    ::setenv("NCCL_DEBUG", "INFO", /*overwrite=*/0);
    ::setenv("NCCL_DEBUG_FILE", (nccl_log_dir + "/nccl_rank" + std::to_string(e.rank) + ".%h.%p.log").c_str(), 0);
  }
  // NCCL's async error handling (a failed or timed-out collective ends the process instead of
  // hanging it): the launcher (torch-free) sets the name of LibTorch >= 2.2, as torchrun 2.x does;
  // this LibTorch reads its own name (compat.h), set here from it unless the user set that one.
  if (backend_ == "nccl" && !std::getenv(compat::kNcclAsyncErrorHandlingVar))
    if (const char* v = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) ::setenv(compat::kNcclAsyncErrorHandlingVar, v, 0);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1e3));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(e.master_port);
    so.isServer = !e.agent_store && e.rank == 0;
    so.numWorkers = e.agent_store ? compat::Optional<size_t>() : compat::Optional<size_t>(e.world_size);
    so.waitWorkers = false;
    so.timeout = timeout;
    so.multiTenant = true;
    c10::intrusive_ptr<c10d::Store> store = compat::tcp_store(e.master_addr, so);
    if (e.agent_store)
      store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(e.restart_count), store);
    impl_->store = c10::make_intrusive<c10d::PrefixStore>("lmtrain/", store);
  } catch (const std::exception& ex) {
    throw Error("rendezvous at " + e.master_addr + ":" + std::to_string(e.master_port) + " failed: " + first_line(ex));
  }
  if (backend_ == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");  // Gloo's own variable, as torch reads it
    if (ifname && !*ifname) ifname = nullptr;
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

std::unique_ptr<Comm> open_process_group(const LaunchEnv& launch, const DistConfig& cfg, const torch::Device& device,
                                         const std::string& nccl_log_dir) {
  if (launch.world_size <= 1 && cfg.backend_auto()) return nullptr;
  LaunchEnv env = launch;
  if (env.world_size <= 1 && env.master_addr.empty()) env.master_addr = "127.0.0.1", env.master_port = 0;  // any free port
  log::info(strf("rank %d of %d (%s launch, local rank %d), rendezvous %s:%d", env.rank, env.world_size,
                 env.source.empty() ? "single-process" : env.source.c_str(), env.local_rank, env.master_addr.c_str(),
                 env.master_port));
  return std::make_unique<Comm>(env, cfg, device, nccl_log_dir);
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

std::shared_ptr<Comm::Pending> Comm::reduce_scatter_async(torch::Tensor in, torch::Tensor out) {
  auto p = std::make_shared<Pending>();
  const int64_t s = out.numel();
  TORCH_CHECK(in.numel() == s * world_, "reduce_scatter_async: in holds world_size * out.numel() values");
  if (backend_ == "nccl") {
    p->tensor = in;  // (out is a slice of it or its own tensor: the collective holds both)
    p->work = impl_->pg->_reduce_scatter_base(out, in);
    return p;
  }
  p->tensor = in.clone();
  std::vector<torch::Tensor> ts{p->tensor};
  p->work = impl_->pg->allreduce(ts);
  p->copy_from = p->tensor.narrow(0, rank_ * s, s);
  p->copy_to = out;
  return p;
}

std::shared_ptr<Comm::Pending> Comm::broadcast_async(torch::Tensor t, int root) {
  TORCH_CHECK(t.device() == impl_->device && t.is_contiguous(), "broadcast_async: a contiguous tensor on the comm device");
  auto p = std::make_shared<Pending>();
  p->tensor = t;
  std::vector<torch::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  p->work = impl_->pg->broadcast(ts, o);
  return p;
}

std::shared_ptr<Comm::Pending> Comm::all_gather_in_place_async(torch::Tensor t) {
  TORCH_CHECK(backend_ == "nccl", "all_gather_in_place_async: NCCL only");
  const int64_t s = t.numel() / world_;
  TORCH_CHECK(s * world_ == t.numel(), "all_gather_in_place_async: world_size * s values");
  auto p = std::make_shared<Pending>();
  p->tensor = t;
  auto mine = t.narrow(0, rank_ * s, s);
  p->work = impl_->pg->_allgather_base(t, mine);
  return p;
}

// Gloo: the host waits, at most dist.timeout_s. NCCL: wait() without a timeout only makes the
// current CUDA stream wait for the collective (ProcessGroupNCCL.cpp, WorkNCCL::wait: a timeout, or
// TORCH_NCCL_BLOCKING_WAIT, turns it into a host busy-wait that stalls the queue), so the host keeps
// queueing work; a hang is caught by the process group's own timeout (dist.timeout_s) and watchdog,
// which abort the communicator and end the process. Errors wait() raises still name the collective.
void Comm::wait(const std::shared_ptr<Pending>& p, const std::string& what) {
  try {
    if (backend_ == "nccl")
      p->work->wait();
    else
      p->work->wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1e3)));
  } catch (const std::exception& ex) {
    throw Error("collective '" + what + "' failed on rank " + std::to_string(rank_) + " (timeout " +
                strf("%.0f", timeout_s_) + " s): " + first_line(ex));
  }
  if (p->copy_to.defined()) p->copy_to.copy_(p->copy_from);
}

void Comm::all_reduce_sum(torch::Tensor& t, const std::string& what) {
  auto dev = t.to(impl_->device).contiguous();
  wait(all_reduce_async(dev), what);
  if (!dev.is_same(t)) t.copy_(dev);
}

void Comm::broadcast(torch::Tensor& t, int root, const std::string& what) {
  auto dev = t.to(impl_->device).contiguous();
  wait(broadcast_async(dev, root), what);
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

torch::Tensor Comm::exchange(const torch::Tensor& mine, int partner, int tag, const std::string& what) {
  auto in = mine.to(impl_->device).contiguous();
  auto out = torch::empty_like(in);
  std::vector<torch::Tensor> send{in}, recv{out};
  auto s = std::make_shared<Pending>(), r = std::make_shared<Pending>();
  if (rank_ < partner) {
    s->work = impl_->pg->send(send, partner, tag);
    r->work = impl_->pg->recv(recv, partner, tag);
  } else {
    r->work = impl_->pg->recv(recv, partner, tag);
    s->work = impl_->pg->send(send, partner, tag);
  }
  wait(s, what);
  wait(r, what);
  return out.to(mine.device());
}

// NCCL runs a barrier as an all-reduce on a device it must guess unless told (the rank modulo the
// device count, or cuda:0 before any collective): tell it ours. Its wait() then syncs that stream.
void Comm::barrier(const std::string& what) {
  c10d::BarrierOptions o;
  if (impl_->device.is_cuda()) o.device_ids = {impl_->device.index()};
  auto p = std::make_shared<Pending>();
  p->work = impl_->pg->barrier(o);
  wait(p, what);
}

// ---- GradSync --------------------------------------------------------------------------------

}  // namespace lm
