// Precompiled header for the torch translation units (lm_models, reused by lm_trainer and the torch
// test suites and tools).
#pragma once
#include <torch/torch.h>
