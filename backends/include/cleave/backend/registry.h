// The backend registry: which backends this build has, which can run on this machine, and
// construction by name ("reference", "onednn", "vulkan[:index|:name]", "cuda[:index]", "auto").
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/backend.h"

namespace cleave::backend {

struct backend_info {
  std::string name;        // "onednn"
  bool available = false;  // usable on this machine
  std::string detail;      // the device when available, else why not (e.g. the driver's error)
  bool real_gpu = false;   // a hardware GPU (not a CPU implementation such as lavapipe)
};

// Every backend compiled into this build, in order of preference for "auto".
std::vector<backend_info> list_backends();
// Their names only, without probing the machine, joined by `separator`.
std::string compiled_backends(std::string_view separator);

// Constructs a backend. `spec` is a name with an optional ":device" suffix, or "auto" (a real
// GPU backend if any is available, else onednn, else reference). Throws core::error naming the
// backend and the reason when it is unknown or unavailable.
std::unique_ptr<core::backend> make_backend(std::string_view spec);

// The name "auto" resolves to on this machine.
std::string resolve_auto();

}  // namespace cleave::backend
