// The report's data-mixture chart: per run with data.sources, the realised share of each source's
// tokens per logged window as stacked areas (records::kSourceTokens of the train records), with the
// target shares of meta.json's data.mixture (its stages, or the sources' weights) as dashed lines
// at the same stack boundaries. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "tools/report/load.h"

namespace lm::report {

// The section body: one <figure data-chart="mixture-RUN"> per run that logged tokens per source;
// "" when no run did.
std::string mixture_html(const std::vector<Run>& runs);

}  // namespace lm::report
