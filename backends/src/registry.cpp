// The backend registry: a fixed table of the backends compiled in.
#include "cleave/backend/registry.h"

#include <functional>

#include "cleave/core/error.h"
#include "factory.h"

namespace cleave::backend {

namespace {

struct entry {
  const char* name;
  backend_info (*probe)();
  std::unique_ptr<core::backend> (*create)(const std::string&);
};

// Order = preference of "auto" among real GPUs, then CPUs.
const std::vector<entry>& table() {
  static const std::vector<entry> t = {
#ifdef CLEAVE_HAVE_CUDA
      {"cuda", detail::probe_cuda, detail::create_cuda},
#endif
#ifdef CLEAVE_HAVE_VULKAN
      {"vulkan", detail::probe_vulkan, detail::create_vulkan},
#endif
#ifdef CLEAVE_HAVE_ONEDNN
      {"onednn", detail::probe_onednn, detail::create_onednn},
#endif
      {"reference", detail::probe_reference, detail::create_reference},
  };
  return t;
}

std::string known_names() {
  std::string s;
  for (const auto& e : table()) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s + ", auto";
}

}  // namespace

std::vector<backend_info> list_backends() {
  std::vector<backend_info> out;
  for (const auto& e : table()) {
    backend_info info = e.probe();
    info.name = e.name;
    out.push_back(std::move(info));
  }
  return out;
}

std::string resolve_auto() {
  const auto all = list_backends();
  for (const auto& b : all)
    if (b.available && b.real_gpu) return b.name;
  for (const auto& b : all)
    if (b.available && (b.name == "onednn" || b.name == "reference")) return b.name;
  return "reference";
}

std::unique_ptr<core::backend> make_backend(std::string_view spec) {
  std::string name(spec), device;
  if (const auto colon = name.find(':'); colon != std::string::npos) {
    device = name.substr(colon + 1);
    name.resize(colon);
  }
  if (name == "auto") name = resolve_auto();
  for (const auto& e : table()) {
    if (name != e.name) continue;
    const backend_info info = e.probe();
    if (!info.available) throw core::error("backend '" + name + "' is not available: " + info.detail);
    return e.create(device);
  }
  throw core::error("unknown backend '" + std::string(spec) + "' (this build has: " + known_names() + ")");
}

}  // namespace cleave::backend
