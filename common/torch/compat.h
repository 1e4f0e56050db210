// The ONE place for LibTorch version differences (Debian's 1.13 CPU build in CI, pip's 2.x with
// CUDA on the GPU machine). Everything else calls these wrappers.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#define LM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace lm::compat {

// The c10d base class of process-group backends (Gloo, NCCL): ProcessGroup in 1.13, Backend in 2.x.
#if LM_TORCH_AT_LEAST(2, 0)
using CommBackend = c10d::Backend;
#else
using CommBackend = c10d::ProcessGroup;
#endif

// "1.13.0" etc.
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

constexpr bool kHasSdpa = LM_TORCH_AT_LEAST(2, 0);

// The variable torchrun sets for NCCL's async error handling (renamed in 2.2; the old name warns).
#if LM_TORCH_AT_LEAST(2, 2)
constexpr const char* kNcclAsyncErrorHandlingVar = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
#else
constexpr const char* kNcclAsyncErrorHandlingVar = "NCCL_ASYNC_ERROR_HANDLING";
#endif

// c10::Allocator in LibTorch 2.3 (c10/core/Allocator.h): allocate() is no longer const
// (`virtual DataPtr allocate(size_t n) = 0;`), and copy_data() is a new pure virtual. An override
// of the old const allocate() would not override anything and leave the class abstract.
#if LM_TORCH_AT_LEAST(2, 3)
#define LM_ALLOCATOR_ALLOCATE_CONST
#define LM_ALLOCATOR_COPY_DATA \
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
#define LM_ALLOCATOR_ALLOCATE_CONST const
#define LM_ALLOCATOR_COPY_DATA
#endif

// The optional type that c10d's option structs (TCPStoreOptions::numWorkers) and ATen's optional
// arguments take: 1.13 has its own c10::optional class; 2.x made c10::optional an alias of
// std::optional (by 2.4) and its headers spell std::optional (c10d/TCPStore.hpp), so code written
// against the alias breaks once it is dropped.
#if LM_TORCH_AT_LEAST(2, 4)
template <typename T>
using Optional = std::optional<T>;
#else
template <typename T>
using Optional = c10::optional<T>;
#endif

// A c10d TCPStore (server or client). LibTorch 2.4 made the libuv server the default
// (TCPStoreOptions::useLibUV = true), and a LibTorch built without libuv (Debian's) then refuses to
// host the store: "use_libuv was requested but PyTorch was build without libuv support". As
// torchrun does, USE_LIBUV=0 asks for the classic server; otherwise libuv is tried first and, where
// this LibTorch has none, the classic one is used (whether it has one is not exported, so the
// refusal is the test). Clients speak the same protocol to either server.
inline c10::intrusive_ptr<c10d::TCPStore> tcp_store(const std::string& host, c10d::TCPStoreOptions opts) {
#if LM_TORCH_AT_LEAST(2, 4)
  const char* env = std::getenv("USE_LIBUV");
  opts.useLibUV = !(env && std::string(env) == "0");
  if (opts.useLibUV) {  // a client is refused the same way (TCPStore's constructor checks either)
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, opts);
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("libuv") == std::string::npos) throw;
      opts.useLibUV = false;
    }
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

// Causal scaled-dot-product attention where LibTorch has it (>= 2.0: flash / memory-efficient /
// cuDNN kernels). REQUIRES: kHasSdpa; models/attention.cpp holds the fallback for 1.13.
inline torch::Tensor sdpa_causal(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 double dropout_p) {
#if LM_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p, /*is_causal=*/true);
#else
  (void)k, (void)v, (void)dropout_p;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch >= 2.0");
  return q;
#endif
}

// Scaled-dot-product attention under a boolean mask (true = attend), broadcast to (B, H, T, S),
// not causal by itself (data.doc_mask: the documents' block-diagonal causal mask). On CUDA the
// memory-efficient kernel takes a mask (2.1+; flash does not), else the math kernel; on the CPU the
// math kernel (2.x before the CPU flash kernel took masks) or the CPU flash kernel.
// REQUIRES: kHasSdpa.
inline torch::Tensor sdpa_masked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& mask, double dropout_p) {
#if LM_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, mask, dropout_p, /*is_causal=*/false);
#else
  (void)k, (void)v, (void)mask, (void)dropout_p;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch >= 2.0");
  return q;
#endif
}

// The kernel at::scaled_dot_product_attention picks for these inputs, causal, no mask
// (at::_fused_sdp_choice; at::SDPBackend in 2.6: 0 math, 1 flash, 2 memory-efficient, 3 cuDNN,
// 4 overrideable); -1 where LibTorch has no SDPA. 2.1 added `scale`, 2.5 `enable_gqa`, both
// defaulted after the six arguments given here. With a boolean `mask`: sdpa_masked's choice (not
// causal, the mask given).
inline int64_t sdpa_choice(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout_p,
                           const torch::Tensor& mask = {}) {
#if LM_TORCH_AT_LEAST(2, 0)
  if (mask.defined()) return at::_fused_sdp_choice(q, k, v, mask, dropout_p, /*is_causal=*/false);
  return at::_fused_sdp_choice(q, k, v, /*attn_mask=*/{}, dropout_p, /*is_causal=*/true);
#else
  (void)q, (void)k, (void)v, (void)dropout_p, (void)mask;
  return -1;
#endif
}

// bf16 autocast on CUDA: enable / disable (2.4 made the API per device type).
inline void set_cuda_autocast(bool enabled, at::ScalarType dtype = at::kBFloat16) {
#if LM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
  at::autocast::set_enabled(enabled);
  at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}
// bf16 autocast on the CPU goes through the same per-device API (LibTorch >= 2.4), so the trainer
// runs the GPU's mixed-precision path on a CPU there; 1.13's CPU autocast has other op lists.
constexpr bool kHasCpuAutocast = LM_TORCH_AT_LEAST(2, 4);
// Autocast for `device`'s type. REQUIRES: CUDA, or kHasCpuAutocast.
inline void set_autocast(const torch::Device& device, bool enabled, at::ScalarType dtype = at::kBFloat16) {
  if (device.is_cuda()) return set_cuda_autocast(enabled, dtype);
#if LM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  TORCH_CHECK(!enabled, "CPU autocast needs LibTorch >= 2.4");
#endif
}
// Autocast's dtype where autocast is on for this device type (CPU, CUDA), else none: what the fused
// head + loss casts to, and the dtype of GPT's residual stream under train.bf16_residual.
inline Optional<at::ScalarType> autocast_dtype(c10::DeviceType type) {
  if (type != c10::DeviceType::CPU && type != c10::DeviceType::CUDA) return {};
#if LM_TORCH_AT_LEAST(2, 4)
  if (!at::autocast::is_autocast_enabled(type)) return {};
  return at::autocast::get_autocast_dtype(type);
#else
  if (type == c10::DeviceType::CUDA) return at::autocast::is_enabled() ? Optional<at::ScalarType>(at::autocast::get_autocast_gpu_dtype()) : Optional<at::ScalarType>();
  return at::autocast::is_cpu_enabled() ? Optional<at::ScalarType>(at::autocast::get_autocast_cpu_dtype()) : Optional<at::ScalarType>();
#endif
}
// The autocast cast cache keeps bf16 copies of fp32 weights until cleared; Python's
// torch.autocast clears it on exit, C++ must do it after every forward/backward (else later steps
// reuse copies of weights the optimizer has since changed).
inline void clear_autocast_cache() { at::autocast::clear_cache(); }

// This thread's whole autocast state: on or off and the dtype, per device type (CPU, CUDA), and
// whether casts of fp32 weights are cached. What activation checkpointing records at a block's
// forward and sets again for the block's rerun in backward (models/recompute.h). Setting CPU
// autocast on here works on 1.13 too (its own op lists; the trainer asks for >= 2.4: set_autocast).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  bool cache = true;
};
inline AutocastState autocast_state() {
  AutocastState s;
#if LM_TORCH_AT_LEAST(2, 4)
  s.cpu = at::autocast::is_autocast_enabled(at::kCPU), s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda = at::autocast::is_autocast_enabled(at::kCUDA), s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
  s.cpu = at::autocast::is_cpu_enabled(), s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
  s.cuda = at::autocast::is_enabled(), s.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
  s.cache = at::autocast::is_autocast_cache_enabled();
  return s;
}
inline void set_autocast_state(const AutocastState& s) {
#if LM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu), at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda), at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
#else
  at::autocast::set_cpu_enabled(s.cpu), at::autocast::set_autocast_cpu_dtype(s.cpu_dtype);
  at::autocast::set_enabled(s.cuda), at::autocast::set_autocast_gpu_dtype(s.cuda_dtype);
#endif
  at::autocast::set_autocast_cache_enabled(s.cache);
}

// The Kineto profiler (torch/csrc/autograd/profiler_kineto.h: prepareProfiler, enableProfiler,
// disableProfiler -> ProfilerResult). 1.13's headers and library have the API too, but Debian's 1.13
// is built without libkineto (its save() writes no trace), so there the legacy recorder runs.
constexpr bool kHasKineto = LM_TORCH_AT_LEAST(2, 0);
// A KinetoEvent's start and duration in ns: startNs()/durationNs() in newer 2.x, startUs()/durationUs()
// before (1.13, 2.0). Templates, so this header needs no profiler header.
namespace kineto_detail {
template <class E>
auto start_ns(const E& e, int) -> decltype(uint64_t(e.startNs())) { return e.startNs(); }
template <class E>
uint64_t start_ns(const E& e, long) { return uint64_t(e.startUs()) * 1000; }
template <class E>
auto duration_ns(const E& e, int) -> decltype(uint64_t(e.durationNs())) { return e.durationNs(); }
template <class E>
uint64_t duration_ns(const E& e, long) { return uint64_t(e.durationUs()) * 1000; }
}  // namespace kineto_detail
template <class KinetoEvent>
uint64_t event_start_ns(const KinetoEvent& e) { return kineto_detail::start_ns(e, 0); }
template <class KinetoEvent>
uint64_t event_duration_ns(const KinetoEvent& e) { return kineto_detail::duration_ns(e, 0); }

constexpr bool kHasFusedAdamW = LM_TORCH_AT_LEAST(2, 1);
// at::_fused_adamw_ has a CPU kernel from 2.4 on (aten/src/ATen/native/FusedAdam.cpp).
constexpr bool kHasCpuFusedAdamW = LM_TORCH_AT_LEAST(2, 4);

// at::_fused_adamw_ (one multi-tensor CUDA kernel; LibTorch >= 2.1; on CPU >= 2.4). Returns false when this
// LibTorch has none, so the caller falls back to its own update. state_steps are float tensors on
// the device that the kernel READS but does not increment (the caller adds 1 first, as
// torch/optim/adam.py's _fused_adam does). found_inf (optional, 0-dim float on the device): where it
// is 1 the kernel returns without touching anything (aten/src/ATen/native/cuda/fused_adam_utils.cuh),
// and the caller undoes its increment of state_steps. grad_scale (optional, 0-dim float on the
// device): the kernel divides every gradient by it before the update (and stores the quotient back).
inline bool fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs, at::TensorList state_steps, double lr, double beta1,
                        double beta2, double weight_decay, double eps, const torch::Tensor& found_inf = {},
                        const torch::Tensor& grad_scale = {}) {
#if LM_TORCH_AT_LEAST(2, 1)
  auto opt = [](const torch::Tensor& t) { return t.defined() ? Optional<at::Tensor>(t) : Optional<at::Tensor>(); };
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, state_steps, lr, beta1, beta2,
                    weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, opt(grad_scale), opt(found_inf));
  return true;
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)state_steps;
  (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps, (void)found_inf, (void)grad_scale;
  return false;
#endif
}

// A storage's memory handed back to its allocator while every tensor and view of it (a module's
// parameters, what autograd saved of them) keeps pointing at the storage, holding nothing; and
// allocated again, its tensors then reading the new memory (PyTorch FSDP's storage resize to 0). No
// version counter moves. The same calls on CPU and CUDA storages, in LibTorch 1.13 and 2.x.
inline void release_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->data_ptr().device()));
  s->set_nbytes(0);
}
inline void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// Autograd's owning pointer to a graph node (torch::autograd::Node): std::shared_ptr<Node> up to 2.13,
// c10::intrusive_ptr<Node> from 2.14 (PyTorch PR #181782; Tensor::grad_fn() and Edge::function too).
// Deduced from grad_accumulator's return type, so no version number is guessed; both have get(),
// operator-> and operator bool. Node must be complete where one is destroyed (intrusive_ptr):
// include <torch/csrc/autograd/function.h> there.
using AutogradNodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));
// The AccumulateGrad node of leaf tensor `t` (made on first use; null for a non-leaf or a tensor
// that does not require grad), kept alive by the caller for as long as hooks on it must fire.
inline AutogradNodePtr grad_accumulator(const torch::Tensor& t) { return torch::autograd::impl::grad_accumulator(t); }

// The global L2 norm of a list of tensors as a 0-dim tensor (no host sync): at::_foreach_norm (a
// multi-tensor kernel on CUDA; 1.13 has it too, per tensor on the CPU), then the norm of the norms.
inline torch::Tensor global_norm(at::TensorList ts) { return at::stack(at::_foreach_norm(ts)).norm(); }

// Every tensor *= a 0-dim tensor on their device (no host sync): at::_foreach_mul_ takes a tensor
// scalar from 2.1 on; before, one mul_ per tensor.
inline void foreach_mul_(at::TensorList ts, const torch::Tensor& scalar) {
#if LM_TORCH_AT_LEAST(2, 1)
  at::_foreach_mul_(ts, scalar);
#else
  for (const auto& t : ts) t.mul_(scalar);  // in-place methods are const on Tensor
#endif
}

}  // namespace lm::compat
