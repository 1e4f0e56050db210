// Model transforms: where tensor, expert, pipeline or context parallelism plugs in. A transform
// changes the module on this rank (splits a matrix over the ranks, places experts, keeps a stage's
// layers), once, after the model is built and before its parameters are laid out flat
// (build_model_parts, model_parts.h), so the flat buffer, the gradient reduction, ZeRO, the
// optimizer and the checkpoints all see the transformed module's parameters, and the loop never
// knows a transform ran (torchtitan's parallelize: each parallelism applied to the module in turn).
//
// The parallelism of the gradients (parallel.h: how they are reduced, what optimizer state a rank
// keeps, whether weights are sharded between uses) composes with it: it runs over whatever
// parameters the transforms left.
//
// Adding one: a class implementing ModelTransform (its own files here), made by model_transforms()
// for the keys that ask for it. A transform that keeps part of a parameter draws its initial values
// itself in apply() (a deferred build's placeholders give it the shapes); tests/trainer/parallel/
// transform_test.cpp shows one (a linear layer split by output columns over 2 Gloo ranks).
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "run/config/config.h"

namespace lm {

class Comm;

// What a transform is applied with: the run's group (nullptr: one process) and this rank.
struct TransformContext {
  Comm* comm = nullptr;
  int rank = 0, world = 1;
};

class ModelTransform {
 public:
  virtual ~ModelTransform() = default;
  // Its name, for the start-up line and meta.json.
  virtual std::string name() const = 0;
  // Changes `model` for this rank; every rank calls it in the same order (it may communicate).
  virtual void apply(torch::nn::Module& model, const TransformContext& ctx) = 0;
  // What meta.json records of it (the same on every rank).
  virtual nlohmann::json record() const { return {{"transform", name()}}; }
};

using ModelTransforms = std::vector<std::shared_ptr<ModelTransform>>;

// The transforms the config asks for, in the order they apply. None yet: no key asks for tensor,
// expert or pipeline parallelism so far.
ModelTransforms model_transforms(const ExperimentConfig& cfg);

// Each of `transforms` applied to `model`, in order (logged on rank 0).
void apply_model_transforms(torch::nn::Module& model, const ModelTransforms& transforms, const TransformContext& ctx);

}  // namespace lm
