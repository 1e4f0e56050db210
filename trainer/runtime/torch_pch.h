// Precompiled header for the torch translation units (lm_core and torch_tests).
#pragma once
#include <torch/torch.h>
