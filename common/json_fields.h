// Reads scalar fields out of one flat JSON object line (metrics.jsonl): enough for the
// launcher and tests, without a JSON library.
#pragma once
#include <optional>
#include <string>

namespace shoal {

// The raw text of the value of "key" (number, true/false/null, or a string without its
// quotes and unescaped for the common escapes); nullopt when absent.
std::optional<std::string> JsonField(const std::string& line, const std::string& key);
std::optional<double> JsonNumber(const std::string& line, const std::string& key);

}  // namespace shoal
