// The backend registry: a fixed table of the backends compiled in; the CUDA backend is a
// plugin loaded on first use (see backends/cuda/cuda_plugin.cpp).
#include "cleave/backend/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>

#include "cleave/core/error.h"
#include "factory.h"

namespace cleave::backend {

namespace {

#ifdef CLEAVE_HAVE_CUDA
// libcleave-cuda.so: $CLEAVE_CUDA_PLUGIN when set, else the first found of lib/cleave beside
// this executable's prefix, the installation's and the build tree's.
struct cuda_plugin {
  void (*probe)(backend_info*) = nullptr;
  core::backend* (*create)(const char*, std::string*) = nullptr;
  std::string error;  // why it did not load
};

cuda_plugin load_cuda_plugin() {
  namespace fs = std::filesystem;
  cuda_plugin p;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("CLEAVE_CUDA_PLUGIN"); env && *env) {
    candidates.emplace_back(env);
  } else {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) candidates.push_back(exe.parent_path().parent_path() / "lib" / "cleave" / "libcleave-cuda.so");
    const std::string dirs = CLEAVE_CUDA_PLUGIN_DIRS;
    for (std::size_t at = 0; at <= dirs.size();) {
      const std::size_t colon = std::min(dirs.find(':', at), dirs.size());
      if (colon > at) candidates.push_back(fs::path(dirs.substr(at, colon - at)) / "libcleave-cuda.so");
      at = colon + 1;
    }
  }
  for (const auto& c : candidates) {
    std::error_code ec;
    if (!fs::exists(c, ec)) {
      p.error = "no " + c.string();
      continue;
    }
    void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = ::dlerror();
      p.error = "cannot load " + c.string() + ": " + (why ? why : "dlopen failed");
      return p;
    }
    p.probe = reinterpret_cast<void (*)(backend_info*)>(::dlsym(h, "cleave_cuda_probe"));
    p.create = reinterpret_cast<core::backend* (*)(const char*, std::string*)>(::dlsym(h, "cleave_cuda_create"));
    if (!p.probe || !p.create) {
      p.error = c.string() + " is not cleave's CUDA plugin";
      p.probe = nullptr;
      p.create = nullptr;
    }
    return p;  // never unloaded: the backends it makes live in it
  }
  return p;
}

const cuda_plugin& cuda() {
  static const cuda_plugin p = load_cuda_plugin();
  return p;
}

// Without an NVIDIA driver's device nodes no CUDA device can be there: say so without loading
// the plugin (and with it cuBLAS and cuDNN) at all.
bool nvidia_driver_present() {
  if (const char* env = std::getenv("CLEAVE_CUDA_PLUGIN"); env && *env) return true;
  return ::access("/dev/nvidiactl", F_OK) == 0 || ::access("/dev/dxg", F_OK) == 0;
}

backend_info probe_cuda_plugin() {
  backend_info info;
  info.name = "cuda";
  if (!nvidia_driver_present()) {
    info.detail = "no NVIDIA driver on this machine (no /dev/nvidiactl)";
    return info;
  }
  const auto& p = cuda();
  if (!p.probe) {
    info.detail = "CUDA plugin unavailable: " + p.error;
    return info;
  }
  p.probe(&info);
  return info;
}

std::unique_ptr<core::backend> create_cuda_plugin(const std::string& device) {
  const auto& p = cuda();
  if (!p.create) throw core::error("backend 'cuda': CUDA plugin unavailable: " + p.error);
  std::string error;
  core::backend* b = p.create(device.c_str(), &error);
  if (!b) throw core::error(error);
  return std::unique_ptr<core::backend>(b);
}
#endif

struct entry {
  const char* name;
  backend_info (*probe)();
  std::unique_ptr<core::backend> (*create)(const std::string&);
};

// Order = preference of "auto" among real GPUs, then CPUs.
const std::vector<entry>& table() {
  static const std::vector<entry> t = {
#ifdef CLEAVE_HAVE_CUDA
      {"cuda", probe_cuda_plugin, create_cuda_plugin},
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
  return compiled_backends(", ") + ", auto";
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

std::string compiled_backends(std::string_view separator) {
  std::string out;
  for (const auto& e : table()) out += (out.empty() ? "" : std::string(separator)) + std::string(e.name);
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
