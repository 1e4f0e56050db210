// Small text helpers shared by every parser of user input.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lm {

// Levenshtein distance between a and b.
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` by edit distance (for "did you mean" messages); "" if none, or
// when `word` is over 256 bytes (no suggestion is worth O(|word| x |candidate|) on hostile input).
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
// Offset of the first byte that is not part of valid UTF-8 (no overlongs, surrogates or code
// points past U+10FFFF), or std::string::npos when all of `s` is valid.
size_t invalid_utf8_at(const std::string& s);
// Whether all of `s` is well-formed UTF-8, as JSON writers require.
inline bool valid_utf8(const std::string& s) { return invalid_utf8_at(s) == std::string::npos; }

}  // namespace lm
