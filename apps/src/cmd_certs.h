// `cleave certs`: provisioning of a federation (its CA, then one key + certificate per node).
#pragma once

namespace CLI {
class App;
}

namespace cleave::apps {

// Adds `certs init`, `certs issue NAME --role server|edge|device`, `certs renew NAME` and
// `certs revoke NAME` to `app`. Failures are thrown as cleave::core::error.
void register_certs_command(CLI::App& app);

}  // namespace cleave::apps
