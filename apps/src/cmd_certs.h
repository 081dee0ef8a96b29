// `cleave certs`: provisioning of a federation (its CA, then one key + certificate per node).
#pragma once

namespace CLI {
class App;
}

namespace cleave::apps {

// Adds `certs init` and `certs issue NAME --role server|edge|device` to `app`. Failures are
// thrown as cleave::core::error.
void register_certs_command(CLI::App& app);

}  // namespace cleave::apps
