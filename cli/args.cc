// Args implementation.
#include "cli/args.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace lathe::cli {

namespace {
std::vector<std::string> Split(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream ss(names);
  std::string n;
  while (std::getline(ss, n, ',')) out.push_back(n);
  return out;
}
std::string KeyOf(const std::vector<std::string>& names) {
  std::string k = names.back();
  while (!k.empty() && k[0] == '-') k.erase(0, 1);
  return k;
}
}  // namespace

void Args::Flag(const std::string& names, const std::string& help, const std::string& def) {
  Spec s;
  s.names = Split(names);
  s.key = KeyOf(s.names);
  s.help = help;
  s.def = def;
  specs_.push_back(s);
}

void Args::Bool(const std::string& names, const std::string& help) {
  Flag(names, help);
  specs_.back().is_bool = true;
}

const Args::Spec* Args::Find(const std::string& flag) const {
  for (const Spec& s : specs_)
    for (const std::string& n : s.names)
      if (n == flag) return &s;
  return nullptr;
}

Status Args::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      help_ = true;
      continue;
    }
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit((unsigned char)a[1]) || a[1] == '.'))) {
      std::string value;
      bool has_value = false;
      size_t eq = a.find('=');
      if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
      const Spec* s = Find(a);
      if (!s) {
        std::vector<std::string> all;
        for (const Spec& sp : specs_) all.insert(all.end(), sp.names.begin(), sp.names.end());
        std::string near = Nearest(a, all);
        return Status::Error(StrFormat("unknown option '%s'%s (see `lathe %s --help`)", a.c_str(),
                                       near.empty() ? "" : (", did you mean '" + near + "'?").c_str(), command_.c_str()));
      }
      if (s->is_bool) {
        values_.emplace(s->key, has_value ? value : "1");
        continue;
      }
      if (!has_value) {
        if (i + 1 >= argc) {
          return Status::Error(StrFormat("option '%s' needs a value", a.c_str()));
        }
        value = argv[++i];
      }
      values_.emplace(s->key, value);
    } else {
      positional_.push_back(a);
    }
  }
  return Status::Ok();
}

std::string Args::Help() const {
  std::string h = "usage: " + usage_ + "\n\noptions:\n";
  for (const Spec& s : specs_) {
    std::string n;
    for (const std::string& x : s.names) n += (n.empty() ? "" : ", ") + x;
    if (!s.is_bool) n += " V";
    h += StrFormat("  %-28s %s%s\n", n.c_str(), s.help.c_str(),
                   s.def.empty() ? "" : (" (default " + s.def + ")").c_str());
  }
  return h;
}

std::string Args::Get(const std::string& name) const {
  auto range = values_.equal_range(name);
  if (range.first != range.second) return std::prev(range.second)->second;
  for (const Spec& s : specs_)
    if (s.key == name) return s.def;
  return "";
}

bool Args::Has(const std::string& name) const { return values_.count(name) > 0; }

bool Args::On(const std::string& name) const {
  std::string v = Get(name);
  return !v.empty() && v != "0" && v != "false";
}

std::vector<std::string> Args::All(const std::string& name) const {
  std::vector<std::string> out;
  auto range = values_.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

Result<int64_t> Args::Int(const std::string& name) const {
  std::string v = Get(name);
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end) {
    return Status::Error(StrFormat("--%s expects an integer, got '%s'", name.c_str(), v.c_str()));
  }
  return (int64_t)x;
}

Result<double> Args::Float(const std::string& name) const {
  std::string v = Get(name);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end) {
    return Status::Error(StrFormat("--%s expects a number, got '%s'", name.c_str(), v.c_str()));
  }
  return x;
}

}  // namespace lathe::cli
