#include "cleave/metrics/registry.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <stdexcept>

namespace cleave::metrics {
namespace {

bool valid_name(const std::string& s) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Label values escape backslash, double quote and newline; help text backslash and newline.
std::string escaped(const std::string& s, bool quote) {
  std::string o;
  o.reserve(s.size());
  for (const char c : s) {
    if (c == '\\')
      o += "\\\\";
    else if (c == '\n')
      o += "\\n";
    else if (quote && c == '"')
      o += "\\\"";
    else
      o += c;
  }
  return o;
}

void check_labels(const std::string& name, const labels& l) {
  for (const auto& [k, v] : l)
    if (!valid_name(k) || k.find(':') != std::string::npos || k.compare(0, 2, "__") == 0)
      throw std::invalid_argument("metric '" + name + "': label name '" + k + "' is not valid");
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<std::int64_t>(v));
  return fmt::format("{}", v);  // the shortest text that reads back as the same double
}

std::uint64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.compare(0, k.size(), k) == 0) return std::stoull(line.substr(k.size())) * 1024;
  return 0;
}

}  // namespace

void registry::describe(const std::string& name, kind k, const std::string& help) {
  if (!valid_name(name) || name.compare(0, 7, "cleave_") != 0)
    throw std::invalid_argument("metric name '" + name + "' is not a valid cleave_* Prometheus name");
  if (k == kind::counter && !ends_with(name, "_total"))
    throw std::invalid_argument("counter '" + name + "' must end in _total");
  if (k == kind::gauge && ends_with(name, "_total"))
    throw std::invalid_argument("gauge '" + name + "' must not end in _total");
  std::lock_guard lock(mu_);
  const auto [it, fresh] = families_.try_emplace(name, family{k, help, {}});
  if (!fresh && (it->second.k != k || it->second.help != help))
    throw std::invalid_argument("metric '" + name + "' declared twice, differently");
}

registry::family& registry::find(const std::string& name, kind k) {
  const auto it = families_.find(name);
  if (it == families_.end()) throw std::invalid_argument("metric '" + name + "' is not declared");
  if (it->second.k != k)
    throw std::invalid_argument("metric '" + name + "' is a " + (k == kind::counter ? "gauge" : "counter"));
  return it->second;
}

void registry::set(const std::string& name, const labels& l, double value) {
  check_labels(name, l);
  std::lock_guard lock(mu_);
  find(name, kind::gauge).series[l] = value;
}

void registry::add(const std::string& name, const labels& l, double delta) {
  if (!(delta >= 0)) throw std::invalid_argument("counter '" + name + "' cannot grow by " + number(delta));
  check_labels(name, l);
  std::lock_guard lock(mu_);
  find(name, kind::counter).series[l] += delta;
}

void registry::raise_to(const std::string& name, const labels& l, double total) {
  check_labels(name, l);
  std::lock_guard lock(mu_);
  double& v = find(name, kind::counter).series[l];
  if (total > v) v = total;
}

void registry::erase(const std::string& name, const labels& l) {
  std::lock_guard lock(mu_);
  find(name, kind::gauge).series.erase(l);
}

double registry::value(const std::string& name, const labels& l) const {
  std::lock_guard lock(mu_);
  const auto f = families_.find(name);
  if (f == families_.end()) return 0;
  const auto s = f->second.series.find(l);
  return s == f->second.series.end() ? 0 : s->second;
}

void registry::on_collect(std::function<void()> f) {
  std::lock_guard lock(mu_);
  collectors_.push_back(std::move(f));
}

std::string registry::render() const {
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard lock(mu_);
    collectors = collectors_;
  }
  for (const auto& c : collectors) c();
  std::lock_guard lock(mu_);
  std::string o;
  for (const auto& [name, f] : families_) {
    if (f.series.empty()) continue;
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escaped(f.help, false), name,
                     f.k == kind::counter ? "counter" : "gauge");
    for (const auto& [l, v] : f.series) {
      o += name;
      if (!l.empty()) {
        o += '{';
        for (std::size_t i = 0; i < l.size(); ++i)
          o += fmt::format("{}{}=\"{}\"", i ? "," : "", l[i].first, escaped(l[i].second, true));
        o += '}';
      }
      o += ' ' + number(v) + '\n';
    }
  }
  return o;
}

std::uint64_t resident_bytes() {
  return status_kib("VmRSS");
}
std::uint64_t peak_resident_bytes() {
  return status_kib("VmHWM");
}

}  // namespace cleave::metrics
