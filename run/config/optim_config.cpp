// The optim: and schedule: sections' keys (see optim_config.h): each one's type, allowed values and
// its one description, printed by `trainer --keys` and docs/config.md. Torch-free (lm_run).
#include "run/config/optim_config.h"

#include "common/config/schema.h"

namespace lm {

const OptimizerKind& optimizer_kind(const std::string& name) {
  for (const auto& k : optimizer_kinds())
    if (name == k.name) return k;
  return optimizer_kinds().front();  // the config loader refuses an unknown name first
}

void describe_optim(config_schema::Schema& s, OptimConfig& o) {
  std::vector<std::string> optimizers;
  for (const auto& k : optimizer_kinds()) optimizers.push_back(k.name);
  s.choice("optim.name", &o.name, "the optimizer (trainer/optim/optimizer.h): adamw = AdamW with decoupled weight "
           "decay, as torch.optim.AdamW; muon = Muon (the hidden matrices' momentum orthogonalised by Newton-Schulz, "
           "AdamW for embeddings, head, norms and biases; under ZeRO each rank owns whole parameters)", optimizers);
  s.number("optim.lr", &o.lr, "peak learning rate (after warmup)", 0, true);
  s.number("optim.beta1", &o.beta1, "AdamW first-moment decay", 0, false, 1, true);
  s.number("optim.beta2", &o.beta2, "AdamW second-moment decay", 0, false, 1, true);
  s.number("optim.eps", &o.eps, "AdamW denominator epsilon", 0, true);
  s.number("optim.weight_decay", &o.weight_decay, "decoupled weight decay, of matrices only (not biases, norms, "
           "embeddings)", 0, false);
  s.number("optim.grad_clip", &o.grad_clip, "max global gradient norm; 0 = no clipping", 0, false);
  s.choice("optim.fused", &o.fused, "the update as at::_fused_adamw_, a non-finite step skipped on the device: "
           "auto = on CUDA (LibTorch >= 2.1), on = also on CPU (LibTorch >= 2.4), off = the flat update",
           {"auto", "on", "off"});
  s.choice("optim.free_grads", &o.free_grads, "per-parameter gradients left undefined between steps (backward "
           "allocates them) instead of one flat buffer zeroed every step; needs the fused AdamW and one rank: "
           "auto = on CUDA where both hold", {"auto", "on", "off"});
  s.choice("optim.clip_in_step", &o.clip_in_step, "clip inside the fused AdamW (its grad_scale) instead of a pass "
           "over the gradients; needs the fused AdamW: auto = on CUDA where it runs", {"auto", "on", "off"});

  s.number("optim.muon_lr", &o.muon_lr, "muon: the hidden matrices' peak learning rate (the schedule scales it as "
           "optim.lr; optim.lr stays the AdamW part's)", 0, true);
  s.number("optim.muon_momentum", &o.muon_momentum, "muon: the matrices' Nesterov momentum", 0, false, 1, true);
  s.integer("optim.muon_ns_steps", &o.muon_ns_steps, "muon: Newton-Schulz iterations per update", 1);
  s.number("optim.z_loss", &o.z_loss, "z-loss: z_loss x logsumexp(logits)^2 added per target token to the "
           "objective (PaLM used 1e-4), logged apart as z_loss (the loss stays the cross-entropy); 0 = off", 0, false);
}

void describe_schedule(config_schema::Schema& s, ScheduleConfig& sc) {
  s.choice("schedule.kind", &sc.kind, "learning-rate schedule after the linear warmup; wsd = warmup, stable at "
           "optim.lr, then a decay to the floor (schedule.decay_steps, decay_fraction or an anneal stage place it)",
           {"cosine", "linear", "constant", "wsd"});
  s.integer("schedule.warmup_steps", &sc.warmup_steps, "steps of linear warmup from 0 to optim.lr", 0);
  s.number("schedule.min_lr_ratio", &sc.min_lr_ratio, "cosine, linear and wsd end at optim.lr x this", 0, false, 1);
  s.integer("schedule.decay_steps", &sc.decay_steps, "cosine, linear: the step at which the decay ends, 0 = "
            "train.max_steps; wsd: the decay's length in steps, ending at train.max_steps (or starting at the anneal "
            "stage), 0 = schedule.decay_fraction", 0);
  s.choice("schedule.decay_shape", &sc.decay_shape, "wsd: the decay's shape, progress p from 0 to 1: linear "
           "(1 - p), 1-sqrt (1 - sqrt(p)) or cosine", {"linear", "1-sqrt", "cosine"});
  s.number("schedule.decay_fraction", &sc.decay_fraction, "wsd: the decay's length as a share of "
           "train.max_steps (torchtitan's decay_ratio); 0 = schedule.decay_steps or the anneal stage gives it",
           0, false, 1, false);
}

}  // namespace lm
