// A node's metrics, rendered in the Prometheus text exposition format (version 0.0.4): families
// of counters and gauges, each a name, a help line and series told apart by their labels.
// Thread-safe: the node's threads update it, the exporter's thread renders it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cleave::metrics {

enum class kind { counter, gauge };

// A series' labels, by name ({"tier", "device"}, {"peer", "server"}).
using labels = std::vector<std::pair<std::string, std::string>>;

class registry {
 public:
  // Declares a family; every family is declared before it is set or added to. Throws
  // std::invalid_argument for a name Prometheus does not accept, a counter not named *_total, a
  // redeclaration with another kind or help, or a name other than "cleave_*".
  void describe(const std::string& name, kind k, const std::string& help);
  // A gauge's value now.
  void set(const std::string& name, const labels& l, double value);
  // A counter grows by `delta` (>= 0; a negative or NaN delta throws std::invalid_argument).
  void add(const std::string& name, const labels& l, double delta = 1.0);
  // A counter's value becomes `total` unless it is already larger: for totals a node keeps itself
  // (bytes a channel counted), so that the series never decreases.
  void raise_to(const std::string& name, const labels& l, double total);
  // Drops a gauge's series (a device that left: its step time is no longer a fact).
  void erase(const std::string& name, const labels& l);
  // The current value of a series (0 when it has none): for tests and the run log.
  double value(const std::string& name, const labels& l = {}) const;
  // Runs before every render, outside the lock (a node refreshes what it only knows on demand).
  void on_collect(std::function<void()> f);
  // Every family with at least one series, sorted by name, series sorted by labels.
  std::string render() const;

 private:
  struct family {
    kind k;
    std::string help;
    std::map<labels, double> series;
  };
  family& find(const std::string& name, kind k);

  mutable std::mutex mu_;
  std::map<std::string, family> families_;
  std::vector<std::function<void()>> collectors_;
};

// The resident set of this process now and at its peak (VmRSS, VmHWM of /proc/self/status), in
// bytes; 0 where that file is not there.
std::uint64_t resident_bytes();
std::uint64_t peak_resident_bytes();

}  // namespace cleave::metrics
