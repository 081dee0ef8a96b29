// `cleave options`: the options reference of the node commands, the demo and train, written from
// their option tables as Markdown (docs/options.md) or roff (the manual page's).
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "node_options.h"

namespace cleave::apps {

namespace {

struct command_docs {
  std::string name, about;
  std::vector<option_doc> options;
};

std::vector<command_docs> all_docs() {
  return {
      {"server", "the top tier", describe(server_options(), default_server_config())},
      {"edge", "an edge relay", describe(edge_options(), default_edge_config())},
      {"agent", "a device agent", describe(agent_options(), default_agent_config())},
      {"demo", "a federation on loopback", demo_option_docs()},
      {"train", "local training", train_option_docs()},
  };
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string markdown_cell(const std::string& s) {
  return replace_all(s, "|", "\\|");
}

std::string markdown(const std::vector<command_docs>& all) {
  std::string out =
      "<!-- Written by `cleave options --format markdown` from the option tables in apps/src; a test checks that "
      "they agree. -->\n";
  for (const auto& c : all) {
    out += "\n#### `cleave " + c.name + "`\n\n| option | value | default | what it sets |\n|---|---|---|---|\n";
    for (const auto& o : c.options) {
      std::string dflt = o.required ? "required" : o.default_text.empty() ? "" : "`" + o.default_text + "`";
      std::string help = markdown_cell(o.help);
      if (!o.env.empty()) help += " (also `$" + o.env + "`)";
      out += "| `--" + o.name + "` | " + markdown_cell(o.hint) + " | " + markdown_cell(dflt) + " | " + help + " |\n";
    }
  }
  return out;
}

std::string roff(std::string s) {
  s = replace_all(s, "\\", "\\e");
  s = replace_all(s, "-", "\\-");
  if (!s.empty() && (s[0] == '.' || s[0] == '\'')) s = "\\&" + s;
  return s;
}

std::string man(const std::vector<command_docs>& all) {
  std::string out =
      ".\\\" Written by `cleave options --format man` from the option tables in apps/src; a test checks that they "
      "agree.\n";
  for (const auto& c : all) {
    out += ".SS cleave " + c.name + "\n";
    for (const auto& o : c.options) {
      out += ".TP\n";
      out += o.hint.empty() ? ".B " + roff("--" + o.name) + "\n"
                            : ".BI " + roff("--" + o.name) + " \" " + roff(o.hint) + "\"\n";
      std::string text = o.help;
      if (o.required) text += " (required)";
      if (!o.default_text.empty()) text += " (default: " + o.default_text + ")";
      if (!o.env.empty()) text += " (also from $" + o.env + ")";
      out += roff(text) + "\n";
    }
  }
  return out;
}

}  // namespace

void register_options_command(CLI::App& app) {
  static std::string format = "markdown";
  auto* c =
      app.add_subcommand("options",
                         "print the options reference of server, edge, agent, demo and train (docs/options.md and "
                         "the manual page's)");
  c->add_option("--format", format, "markdown or man")
      ->capture_default_str()
      ->check(CLI::IsMember({"markdown", "man"}));
  c->callback([] {
    const auto all = all_docs();
    const std::string text = format == "man" ? man(all) : markdown(all);
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace cleave::apps
