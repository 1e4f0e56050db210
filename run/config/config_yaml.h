// Reading a YAML file that holds one config-like document: the experiment file, a sweep file, a
// run's config.yaml. One reader, so that every such file is refused the same way.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace lm {

// The one YAML document in the file at `path`; `what` names the file's kind in messages
// ("config file", "sweep file"). Throws ConfigError (exit 2) with one line naming the file:
// "PATH: cannot open WHAT", "PATH: is a directory", "PATH:LINE: not valid UTF-8",
// "PATH:LINE: YAML syntax error: ..." and "PATH:LINE: a second YAML document ...", LINE being the
// line where the second document starts (a file holds one document: the rest would be ignored).
// An empty file is a null node.
YAML::Node load_yaml_file(const std::string& path, const std::string& what);

}  // namespace lm
