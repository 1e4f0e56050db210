// One YAML document from a file (see config_yaml.h).
#include "run/config/config_yaml.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "common/text.h"

namespace lm {
namespace {

// Records where each document starts; ignores the rest.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

std::string read_text(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(path + ": is a directory, expected a YAML " + (what == "config file" ? std::string("experiment file") : what));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open " + what);
  std::ostringstream text;
  text << in.rdbuf();  // (an empty file sets failbit: fine)
  std::string s = text.str();
  if (const size_t at = invalid_utf8_at(s); at != std::string::npos)
    throw ConfigError(path + ":" + std::to_string(1 + std::count(s.begin(), s.begin() + static_cast<ptrdiff_t>(at), '\n')) +
                      ": not valid UTF-8 (byte " + std::to_string(at) + "); YAML files are UTF-8");
  return s;
}

}  // namespace

YAML::Node load_yaml_file(const std::string& path, const std::string& what) {
  const std::string text = read_text(path, what);
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts docs;
    while (parser.HandleNextDocument(docs))
      if (docs.starts.size() > 1)
        throw ConfigError(path + ":" + std::to_string(docs.starts[1].line + 1) +
                          ": a second YAML document ('---'); a " + what +
                          " holds one document (the second would be ignored): remove it or merge it into the first");
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ": YAML error: " + e.msg);
  }
}

}  // namespace lm
