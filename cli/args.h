// A small command-line flag parser shared by the sub-commands: typed flags with defaults,
// positional arguments, --help text, and errors that name the flag and the nearest valid one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/strings.h"

namespace lathe::cli {

class Args {
 public:
  Args(std::string command, std::string usage) : command_(std::move(command)), usage_(std::move(usage)) {}

  // Declare flags before Parse. `names` like "-m,--model"; value flags take the next argument
  // (or --flag=value); bool flags take none.
  void Flag(const std::string& names, const std::string& help, const std::string& def = "");
  void Bool(const std::string& names, const std::string& help);

  // Parses argv[1..]. Returns an error for unknown flags (with a suggestion) and missing values.
  // Sets help_requested() on -h/--help.
  Status Parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  std::string Help() const;

  std::string Get(const std::string& name) const;  // by long name without dashes, e.g. "model"
  bool Has(const std::string& name) const;          // given on the command line
  bool On(const std::string& name) const;           // bool flag set
  Result<int64_t> Int(const std::string& name) const;
  Result<double> Float(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // All values of a repeatable flag, in order.
  std::vector<std::string> All(const std::string& name) const;

 private:
  struct Spec {
    std::vector<std::string> names;
    std::string key, help, def;
    bool is_bool = false;
  };
  const Spec* Find(const std::string& flag) const;
  std::string command_, usage_;
  std::vector<Spec> specs_;
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace lathe::cli
