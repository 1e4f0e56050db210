// The model and what updates it (see model_parts.h).
#include "trainer/parallel/model_parts.h"

#include <algorithm>
#include <map>
#include <memory>

#include "common/errors.h"
#include "common/log.h"
#include "models/attention.h"
#include "models/build.h"
#include "models/registry.h"
#include "trainer/hf/hf_dir.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/parallel/transform.h"

namespace lm {

ModelParts build_model_parts(const ExperimentConfig& cfg, int64_t vocab, int64_t data_vocab, int64_t eos_id,
                             const torch::Device& device, RngStreams& rng, Comm* comm, int rank, int world) {
  // Refused before any allocation; a process group at world size 1 all-reduces the flat buffer too.
  GradPath path = resolve_grad_path(cfg.optim, device.is_cuda(), world, !cfg.dist.backend_auto());
  path.pieces = grads_in_pieces(cfg.dist, world, comm != nullptr);  // the parallelism keeps its pieces only
  path.weight_pieces = weights_in_pieces(cfg.dist, world, comm != nullptr);
  const auto seed = static_cast<uint64_t>(cfg.run.seed);
  ModelParts m;
  rng.seed_shared(seed);  // identical init on every rank
  // Built with placeholders (models/build.h), laid out, then each parameter drawn whole in turn and
  // written where it is kept: only this rank's pieces under ZeRO-3 (weights_part), so no rank ever
  // holds every weight, not even at the start. Nothing may draw from the default generator between
  // the build and init_weights (the values are then build_model's on every rank).
  m.model = build_model_deferred(cfg.model, vocab, device);
  // Tensor, expert or pipeline parallelism changes the module here, before the flat layout
  // (transform.h; none configured yet).
  apply_model_transforms(*m.model, model_transforms(cfg), {comm, rank, world});
  m.flat = std::make_unique<FlatParams>(*m.model, path);
  m.parallel = make_parallelism({cfg.dist, comm, *m.flat, *m.model, rank, world, seed, cfg.train.grad_accum,
                                 cfg.train.micro_batch_size, optimizer_kind(cfg.optim.name).whole_params});
  const auto keep = m.parallel->weights_part();
  const WeightWriter write = [&](const torch::Tensor& p, const torch::Tensor& v) { m.flat->write(p, v, keep ? &*keep : nullptr); };
  m.model->init_weights(write);
  init_from_hf(*m.model, cfg.model.init_from, write);  // model.init_from, when set
  if (m.flat->values_pending()) {
    std::string names;
    for (const auto& n : m.flat->pending_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("model: " + cfg.model.arch + "'s init_weights left parameters unwritten (" + names + ")");
  }
  m.model->numerics.fused_loss = cfg.train.fused_loss_on(device.is_cuda());
  m.model->numerics.bf16_residual = cfg.train.bf16_residual;
  m.model->numerics.recompute_blocks = cfg.train.recompute_blocks();
  m.model->numerics.z_loss = cfg.optim.z_loss;
  m.model->numerics.doc_eos = cfg.data.doc_mask ? eos_id : -1;
  if (rank == 0) {  // before seed_rank: a dropout in the probe draws from the stream seed_rank resets
    log::info(describe_attention(cfg.model, cfg.train.micro_batch_size, cfg.train.bf16() ? torch::kBFloat16 : torch::kFloat,
                                 device, /*train=*/true, cfg.data.doc_mask));
    if (cfg.data.doc_mask)
      log::info(strf("documents: attention within each document, positions restarting at each (data.doc_mask; EOS id %lld)",
                     (long long)eos_id));
    log::info(strf("loss: %s (train.fused_loss=%s)%s; residual stream %s (train.bf16_residual)",
                   m.model->numerics.fused_loss ? "the fused head + cross-entropy" : "fp32 logits + cross-entropy",
                   cfg.train.fused_loss.c_str(),
                   cfg.optim.z_loss > 0 ? strf(", z-loss %g x logsumexp^2 per target token (optim.z_loss)", cfg.optim.z_loss).c_str() : "",
                   cfg.train.bf16_residual ? "bf16" : "fp32"));
    log::info(strf("activations: %s (train.activation_checkpointing=%s)",
                   m.model->numerics.recompute_blocks ? "each block's input kept, the block run again in the backward"
                                                       : "every block's kept for the backward",
                   cfg.train.activation_checkpointing.c_str()));
  }
  m.opt = make_optimizer(*m.flat, cfg.optim, m.parallel->optimizer_ranges());
  if (cfg.train.ema_decay > 0) {
    m.ema = std::make_unique<Ema>(*m.flat, cfg.train.ema_decay, m.parallel->weights_part());
  }
  rng.seed_rank(seed, rank);  // each rank's own dropout stream
  m.params = m.model->num_params();
  m.flops_per_token = flops_per_token(cfg.model, vocab, cfg.model.seq_len);
  log::info(strf("model: %s, %lld parameters (%.2fM), vocab %lld (data %lld), %.3g FLOPs/token at T=%lld (%s)",
                 cfg.model.arch.c_str(), (long long)m.params, m.params / 1e6, (long long)vocab, (long long)data_vocab,
                 m.flops_per_token, (long long)cfg.model.seq_len, flops_formula(cfg.model).c_str()));
  if (path.free_grads || path.clip_in_step)
    log::info(strf("gradients: %s, clipped %s", path.free_grads ? "per parameter, freed after each update (optim.free_grads)"
                                                                  : "in one flat buffer",
                   path.clip_in_step ? "inside the fused AdamW (optim.clip_in_step)" : "in a pass of their own"));
  return m;
}

void ModelParts::register_state(StateRegistry& state, const std::string& resume_dir) {
  using S = StateRegistry::Scope;
  namespace k = state_key;
  const auto part = parallel->weights_part();  // ZeRO-3: each rank saves its pieces, one part per rank
  model_state = std::make_unique<ModuleState>(*model, resume_dir + "/model", flat.get(), part);
  state.add(k::kModel, part ? S::kSharded : S::kReplicated, *model_state);
  state.add(k::kOptimizer, parallel->shards_optimizer() ? S::kSharded : S::kReplicated, *opt);
  if (ema) state.add(k::kEma, ema->part() ? S::kSharded : S::kReplicated, *ema, /*optional=*/true);
  if (Stateful* p = parallel->checkpointed()) state.add(k::kParallel, S::kReplicated, *p, /*optional=*/true);
}

double ModelParts::with_ema_weights(const std::function<double()>& fn) {
  // Weights kept in parts: the EMA's pieces swapped in; what a forward gathered of the others is
  // gathered again (told before and after).
  const double v = ema->with_weights([&] {
    parallel->weights_replaced();
    return fn();
  });
  parallel->weights_replaced();
  return v;
}

void ModelParts::save_weights(const std::string& path, const std::string& arch, int64_t step, int rank) const {
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"arch", arch}, {"step", std::to_string(step)}};
  if (!parallel->weights_part()) {  // every rank holds them whole
    if (rank == 0) save_safetensors(path, module_tensors(*model), meta);
    return;
  }
  // One tensor at a time, each gathered alone (every rank, in the file's order), written by rank 0:
  // the bytes save_safetensors writes.
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : module_tensors(*model)) specs.push_back(TensorSpec::of(name, t));
  std::map<std::string, FlatRange> range_of;
  for (const auto& e : flat->entries()) range_of[e.name] = {e.offset, e.numel};
  std::unique_ptr<SafetensorsWriter> out;
  if (rank == 0) out = std::make_unique<SafetensorsWriter>(path, specs, meta);
  std::sort(specs.begin(), specs.end(), [](auto& a, auto& b) { return a.name < b.name; });  // the file's order
  for (const auto& s : specs) {
    auto it = range_of.find(s.name);
    TORCH_CHECK(it != range_of.end(), "save_weights: '", s.name, "' is not a parameter of the flat buffer");
    const auto values = parallel->gather_weights(it->second);
    if (out) out->write(values.view(s.shape));
  }
  if (out) out->commit();
}

}  // namespace lm
