// The `cleave` command line: local training, provisioning, and the split-learning nodes.
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cleave/backend/registry.h"
#include "cleave/core/build_info.h"
#include "cleave/core/error.h"
#include "commands.h"
#include "config_file.h"

int main(int argc, char** argv) {
  CLI::App app{"cleave: split learning across edge devices, edge servers and GPU servers"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version",
      [] {
        const auto& b = cleave::core::this_build();
        return "cleave " + std::string(b.version) + " (commit " + std::string(b.commit) + ", " +
               std::string(b.build_type) + " build; backends: " + cleave::backend::compiled_backends(", ") + ")";
      },
      "print the version, the commit, the build type and the backends compiled in, and exit");
  app.footer(
      "`cleave COMMAND --help` lists a command's options; `man cleave` describes the files, signals and exit "
      "status.\nExit status: 0 done, 1 error (the message says which input or peer), 2 bad configuration file, "
      "70 internal error, 100 and above a bad command line.");
  // One config format for every command: TOML, a [section] per subcommand, keys = long options.
  app.set_config("--config", "", "read options from a TOML file, e.g. [server] rounds = 10");
  // Set before the subcommands exist: they inherit both.
  const auto toml = std::make_shared<cleave::apps::strict_toml>();
  app.config_formatter(toml);
  app.allow_config_extras(CLI::config_extras_mode::error);
  std::string level = "info";
  app.add_option("--log-level", level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] {
    cleave::apps::require_finite_numbers(app);
    spdlog::set_level(spdlog::level::from_str(level));
    spdlog::set_pattern("%H:%M:%S.%e %^%-5l%$ %v");
  });
  cleave::apps::register_train_commands(app);
  cleave::apps::register_models_command(app);
  cleave::apps::register_export_command(app);
  cleave::apps::register_node_commands(app);
  cleave::apps::register_job_command(app);
  cleave::apps::register_certs_command(app);
  cleave::apps::register_provision_command(app);
  cleave::apps::register_options_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    std::fprintf(stderr, "cleave: error: %s\n", cleave::apps::config_error(app, *toml, e).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const cleave::core::error& e) {
    std::fprintf(stderr, "cleave: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "cleave: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // a bug: still a message and a status, not an abort
    std::fprintf(stderr, "cleave: internal error: %s\n", e.what());
    return 70;
  }
  return 0;
}
