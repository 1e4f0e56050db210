// Activation recomputation of one block (see recompute.h).
#include "models/recompute.h"

#include <mutex>
#include <utility>

#include "common/torch/compat.h"

namespace lm {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The default generators' states: the CPU's (dropout on the CPU, and what CPU code draws) and, for
// a CUDA tensor's block, its device's.
struct RngStates {
  torch::Device device{torch::kCPU};
  torch::Tensor cpu, cuda;
};

torch::Tensor ckpt_generator_state(const torch::Device& d) {
  at::Generator gen = at::globalContext().defaultGenerator(d);  // a handle on the shared generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void ckpt_set_generator_state(const torch::Device& d, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

RngStates ckpt_rng_now(const torch::Device& device) {
  RngStates s;
  s.device = device;
  s.cpu = ckpt_generator_state(torch::Device(torch::kCPU));
  if (device.is_cuda()) s.cuda = ckpt_generator_state(device);
  return s;
}

void ckpt_set_rng(const RngStates& s) {
  ckpt_set_generator_state(torch::Device(torch::kCPU), s.cpu);
  if (s.cuda.defined()) ckpt_set_generator_state(s.device, s.cuda);
}

// For its scope: the generators at `s`; then back at the states it found.
class RngScope {
 public:
  explicit RngScope(const RngStates& s) : found_(ckpt_rng_now(s.device)) { ckpt_set_rng(s); }
  ~RngScope() { ckpt_set_rng(found_); }
  RngScope(const RngScope&) = delete;
  RngScope& operator=(const RngScope&) = delete;

 private:
  RngStates found_;
};

// For its scope: autocast as `s` says, with the cast cache off; then the state it found.
class AutocastScope {
 public:
  explicit AutocastScope(compat::AutocastState s) : found_(compat::autocast_state()) {
    s.cache = false;
    compat::set_autocast_state(s);
  }
  ~AutocastScope() { compat::set_autocast_state(found_); }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  compat::AutocastState found_;
};

// What the backward needs besides x: the block, its parameters, and the random and autocast states
// the first run started from. Held by the autograd context (a capsule: the one slot of
// AutogradContext::saved_data that owns a C++ object).
struct Recompute : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> block;
  std::vector<torch::Tensor> params;
  RngStates rng;
  compat::AutocastState autocast;
};

struct CheckpointBlock : torch::autograd::Function<CheckpointBlock> {
  // params are inputs of the node so that their gradients go through autograd's own accumulation;
  // the forward reads them through the block.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, c10::intrusive_ptr<Recompute> r,
                               at::TensorList params) {
    r->params = params.vec();
    r->rng = ckpt_rng_now(x.device());
    r->autocast = compat::autocast_state();
    torch::Tensor y;
    {
      torch::NoGradGuard no_grad;  // (Function::apply runs forward without grad already)
      AutocastScope no_cache(r->autocast);
      y = r->block(x);
    }
    ctx->save_for_backward({x});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(r));
    return y;
  }

  // The block again from x, at the first run's random and autocast states, then its backward (at
  // the backward's own autocast state, as without checkpointing) for x and the parameters.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto x = ctx->get_saved_variables()[0];
    const auto holder = ctx->saved_data["recompute"].toCapsule();
    const Recompute& r = static_cast<const Recompute&>(*holder);
    auto xr = x.detach().requires_grad_(x.requires_grad());
    torch::Tensor y;
    {
      RngScope rng(r.rng);
      AutocastScope autocast(r.autocast);
      torch::AutoGradMode grad(true);
      y = r.block(xr);
    }
    variable_list inputs;  // what takes a gradient, and its slot in the result: x, r (none), params
    std::vector<size_t> slots;
    if (xr.requires_grad()) inputs.push_back(xr), slots.push_back(0);
    for (size_t i = 0; i < r.params.size(); ++i)
      if (r.params[i].requires_grad()) inputs.push_back(r.params[i]), slots.push_back(2 + i);
    variable_list out(2 + r.params.size());
    if (inputs.empty()) return out;
    auto grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) out[slots[i]] = grads[i];
    return out;
  }
};

}  // namespace

torch::Tensor recompute_block(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& x,
                               const std::vector<torch::Tensor>& params) {
  auto r = c10::make_intrusive<Recompute>();
  r->block = std::move(block);
  return CheckpointBlock::apply(x, std::move(r), at::TensorList(params));
}

}  // namespace lm
