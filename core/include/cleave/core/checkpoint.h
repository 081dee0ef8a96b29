// Checkpoints: the model spec, training position, parameters, state and optimizer state in
// one file, written atomically (temporary file, fsync, rename) and checked on load (magic,
// version, sizes, CRC-32), so a failed load says why and a crash never leaves a torn file.
//
// Layout (little-endian): "CLVCKPT1" | u64 header bytes | header JSON | tensor payload |
// u32 CRC-32 of everything before it. The header lists every tensor: name, dtype, shape,
// byte offset into the payload.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/optimizer.h"
#include "cleave/core/stage.h"

namespace cleave::core {

struct checkpoint {
  std::string model_json;  // model_spec::json
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;  // completed epochs (or rounds)
  std::int64_t step = 0;   // optimizer steps taken
  std::string optimizer;   // "sgd" / "adamw"
  struct entry {
    std::string name;
    shape dims;
    std::vector<float> values;
  };
  std::vector<entry> tensors;  // params "p:<name>", state "s:<name>", optimizer "o<k>:<name>"
  // What else the writer needs to continue (a federation's round state): text by name.
  std::map<std::string, std::string> meta;
  // The entry named `name`, or null.
  const entry* find(const std::string& name) const;
};

void save_checkpoint(const std::string& path, const checkpoint& c);
checkpoint load_checkpoint(const std::string& path);

// A checkpoint written again and again under one path with the previous ones kept beside it
// (PATH.1 the newest of them, up to PATH.<keep>). A new one is written beside the others first,
// then they move down and it takes its place: a crash at any point leaves every one written so
// far readable.
class checkpoint_series {
 public:
  checkpoint_series(std::string path, int keep) : path_(std::move(path)), keep_(keep) {}
  // Throws error naming `what` (the option) when the path cannot be written: a directory, a
  // directory that does not exist, or one this process cannot write in.
  void check_writable(const std::string& what) const;
  // Writes c; "" or why it failed (the files already there are kept then).
  std::string save(const checkpoint& c) const;
  // The readable one of the highest epoch among the path and the kept ones.
  struct found {
    std::optional<checkpoint> newest;
    std::string from;                                             // its file
    std::vector<std::pair<std::string, std::string>> unreadable;  // files there not read, and why
  };
  found newest() const;

 private:
  std::vector<std::string> files() const;  // the path, the one being written, the kept ones
  std::string path_;
  int keep_;
};

// Copies a stage's parameters, state and optimizer state to / from a checkpoint.
checkpoint capture(const stage& s, const optimizer& opt, std::uint64_t seed, std::int64_t epoch);
// Throws naming the first tensor that is missing or has another shape.
void restore(stage& s, optimizer& opt, const checkpoint& c);

}  // namespace cleave::core
