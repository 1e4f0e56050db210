// The model-transform hook (trainer/parallel/transform.h) shown with one tiny transform: a linear
// layer split by output columns over 2 Gloo ranks (threads of this process, each with its own
// process group on loopback), as tensor parallelism's column-parallel linear does it. Rank r keeps
// output columns [r*o/2, (r+1)*o/2) of the weight and bias; the forward all-gathers the ranks'
// columns; the backward hands each rank its columns' gradient, and the input's gradient is the sum
// of the ranks' two partial products, added in rank order on every rank.
//
// Against the whole layer: the outputs and the weight and bias gradients bit for bit (each value is
// the same dot product, over the same terms in the same order, whichever columns the product
// computes), and the input gradient within the bound of the arithmetic: each of its values is a
// float32 dot product of length o, computed whole (error <= gamma_o S) or as two halves added
// (<= gamma_{o/2+1} S), S = sum_k |gy_k w_kj|, gamma_n = n u / (1 - n u), u = 2^-24: so the two
// differ by at most (gamma_o + gamma_{o/2+1}) S. Checked to fail with the columns of rank 1 taken
// from rank 0's (the outputs differ) and with the input gradient left partial (not summed).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <thread>

#include "run/config/dist_config.h"
#include "tests/testutil.h"
#include "trainer/comm/launch_env.h"
#include "trainer/comm/process_group.h"
#include "trainer/parallel/transform.h"

namespace lm {
namespace {

// The whole model: one linear layer behind a swappable holder (what a model exposes to transforms).
struct TinyImpl : torch::nn::Module {
  TinyImpl(int64_t in, int64_t out) { proj = register_module("proj", torch::nn::Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) { return proj_forward(x); }
  std::shared_ptr<torch::nn::Module> proj;
  std::function<torch::Tensor(const torch::Tensor&)> proj_forward = [this](const torch::Tensor& x) {
    return std::dynamic_pointer_cast<torch::nn::LinearImpl>(proj)->forward(x);
  };
};
TORCH_MODULE(Tiny);

// The forward's all-gather of the ranks' output columns; its backward keeps this rank's columns.
struct GatherColumns : torch::autograd::Function<GatherColumns> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor local, Comm* comm) {
    ctx->saved_data["cols"] = local.size(1);
    ctx->saved_data["rank"] = comm->rank();
    const int64_t n = local.size(0), w = comm->world_size();
    const auto all = comm->all_gather(local.contiguous(), "all-gather of the split layer's columns");
    return all.view({w, n, local.size(1)}).permute({1, 0, 2}).reshape({n, w * local.size(1)});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    const int64_t cols = ctx->saved_data["cols"].toInt(), r = ctx->saved_data["rank"].toInt();
    return {g[0].narrow(1, r * cols, cols).contiguous(), torch::Tensor()};
  }
};

// The input as is; its gradient the ranks' partial products added in rank order, on every rank.
struct SumInputGrad : torch::autograd::Function<SumInputGrad> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, Comm* comm) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    auto* comm = reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    const auto parts = comm->all_gather(g[0].contiguous(), "all-gather of the input gradient's partial products")
                           .view({comm->world_size(), g[0].size(0), g[0].size(1)});
    torch::Tensor sum = parts[0].clone();
    for (int64_t r = 1; r < comm->world_size(); ++r) sum += parts[r];
    return {sum, torch::Tensor()};
  }
};

// The transform: module "proj" (a Linear) replaced by this rank's columns of it.
struct ColumnSplit : ModelTransform {
  std::string name() const override { return "column-split proj"; }
  void apply(torch::nn::Module& model, const TransformContext& ctx) override {
    auto& tiny = dynamic_cast<TinyImpl&>(model);
    auto whole = std::dynamic_pointer_cast<torch::nn::LinearImpl>(tiny.proj);
    const int64_t out = whole->weight.size(0), cols = out / ctx.world;
    torch::nn::Linear mine(torch::nn::LinearOptions(whole->weight.size(1), cols));
    {
      torch::NoGradGuard ng;
      mine->weight.copy_(whole->weight.narrow(0, ctx.rank * cols, cols));
      mine->bias.copy_(whole->bias.narrow(0, ctx.rank * cols, cols));
    }
    tiny.proj = tiny.replace_module("proj", mine);
    Comm* comm = ctx.comm;
    tiny.proj_forward = [mine, comm](const torch::Tensor& x) mutable {
      return GatherColumns::apply(mine->forward(SumInputGrad::apply(x, comm)), comm);
    };
  }
};

struct Result {
  torch::Tensor y, dw, db, dx;
};

Result run(Tiny& model, const torch::Tensor& x0, const torch::Tensor& gy) {
  auto x = x0.clone().requires_grad_(true);
  auto y = model->forward(x);
  (y * gy).sum().backward();
  auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(model->proj);
  return {y.detach(), lin->weight.grad(), lin->bias.grad(), x.grad()};
}

TEST(ModelTransform, ColumnSplitLinearOverTwoGlooRanks) {
  const int64_t in = 24, out = 16, n = 7;
  torch::manual_seed(11);
  Tiny whole(in, out);
  const auto x = torch::randn({n, in}), gy = torch::randn({n, out});
  const Result want = run(whole, x, gy);
  const int port = test::free_port();
  std::vector<Tiny> models;  // the same whole layer for every rank, made here: the threads share the generator
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(11);
    models.emplace_back(in, out);
  }
  Result got[2];
  std::string errors[2];
  auto rank = [&](int r) {
    try {
      LaunchEnv env;
      env.rank = r, env.world_size = 2, env.master_addr = "127.0.0.1", env.master_port = port;
      DistConfig dc;
      dc.backend = "gloo", dc.timeout_s = 60;
      Comm comm(env, dc, torch::kCPU);
      Tiny& model = models[static_cast<size_t>(r)];  // the whole layer, then split
      apply_model_transforms(*model, {std::make_shared<ColumnSplit>()}, {&comm, r, 2});
      got[r] = run(model, x, gy);
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join(), t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  const int64_t cols = out / 2;
  const double u = std::ldexp(1.0, -24);
  auto gamma = [&](double k) { return k * u / (1 - k * u); };
  const auto w = std::dynamic_pointer_cast<torch::nn::LinearImpl>(whole->proj)->weight.detach();
  const auto S = gy.to(torch::kDouble).abs().matmul(w.to(torch::kDouble).abs());  // (n, in)
  const auto bound = (gamma(out) + gamma(cols + 1)) * S;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(got[r].y, want.y)) << "rank " << r << ": the outputs";
    EXPECT_TRUE(torch::equal(got[r].dw, want.dw.narrow(0, r * cols, cols))) << "rank " << r << ": the weight gradient";
    EXPECT_TRUE(torch::equal(got[r].db, want.db.narrow(0, r * cols, cols))) << "rank " << r << ": the bias gradient";
    const auto diff = (got[r].dx.to(torch::kDouble) - want.dx.to(torch::kDouble)).abs();
    EXPECT_TRUE(diff.le(bound).all().item<bool>())
        << "rank " << r << ": the input gradient, worst excess " << (diff - bound).max().item<double>();
  }
  EXPECT_TRUE(torch::equal(got[0].dx, got[1].dx)) << "every rank adds the partial products in the same order";
}

}  // namespace
}  // namespace lm
