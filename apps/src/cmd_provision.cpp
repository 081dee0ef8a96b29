// `cleave provision PROJECT.toml [--add NAME...]`: the command-line layer over provision.h.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "provision.h"

namespace cleave::apps {

namespace {

struct provision_args {
  std::string file;
  std::vector<std::string> add;
};

void run_provision(const CLI::App& root, const provision_args& a) {
  // Options copied into a node's configuration must be options of its command.
  const option_check has_option = [&root](const std::string& command, const std::string& key) {
    const CLI::App* sub = nullptr;
    try {
      sub = root.get_subcommand(command);
    } catch (const CLI::OptionNotFound&) {
      return false;
    }
    const CLI::Option* o = sub->get_option_no_throw("--" + key);
    return o != nullptr && o->get_configurable();
  };
  const project p = read_project(a.file, has_option);
  provision_options opts;
  opts.add = a.add;
  const auto r = provision(p, opts);
  std::cout << "project '" << p.name << "': " << (r.new_ca ? "created " : "using ") << r.ca << "\n";
  int n_kits = 0;
  for (const auto& k : r.nodes) {
    if (k.kit.empty()) {
      std::cout << "  " << k.node << ": " << k.note << "\n";
      continue;
    }
    ++n_kits;
    std::cout << "  " << k.node << ": kit " << k.kit.string() << " (" << k.note << ")\n";
  }
  std::cout << n_kits << (n_kits == 1 ? " kit" : " kits")
            << " written (mode 0600: each holds its node's private key). On a node: tar -xzf NAME.tar.gz && "
               "NAME/start.sh\n";
}

}  // namespace

void register_provision_command(CLI::App& app) {
  auto a = std::make_shared<provision_args>();
  auto* p = app.add_subcommand(
      "provision",
      "From a project file: the federation CA (created once, then reused), node certificates, and a startup kit "
      "(.tar.gz) per node");
  p->add_option("project", a->file, "Project file (TOML): [project], [server]/[edge]/[agent] defaults, [[node]]s")
      ->required()
      ->check(CLI::ExistingFile);
  p->add_option("--add", a->add,
                "Provision only these new nodes of the project (repeatable); the others' keys and kits are left as "
                "they are");
  p->callback([&app, a] { run_provision(app, *a); });
}

}  // namespace cleave::apps
