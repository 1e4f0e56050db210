// Precompiled header for the torch translation units (lm_core, models_tests, trainer_tests).
#pragma once
#include <torch/torch.h>
