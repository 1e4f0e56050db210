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
// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
// U+10FFFF), as JSON writers require.
bool valid_utf8(const std::string& s);

}  // namespace lm
