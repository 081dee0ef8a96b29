// Progress display for long work: a live bar on a terminal, periodic lines otherwise.
#pragma once

#include <cstdint>
#include <string>

namespace cleave::apps {

class progress_bar {
 public:
  explicit progress_bar(std::string title);
  // Shows done/total with a free-form status; on a terminal redraws one line, else prints a
  // line every 10%.
  void update(std::int64_t done, std::int64_t total, const std::string& status);
  // Ends the bar with a final line.
  void finish(const std::string& status);

 private:
  std::string title_;
  bool tty_;
  int last_decile_ = -1;
  std::int64_t total_ = 0;
};

}  // namespace cleave::apps
