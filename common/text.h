// Small text helpers shared by every parser of user input.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lm {

// Levenshtein distance between a and b.
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` by edit distance (for "did you mean" messages); "" if none.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace lm
