// Writes the fuzz seed corpus: one frame of every message type, and a stream of all of them.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "sample_messages.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<char> stream;
  for (auto& [name, builder] : cleave::transport::testing::sample_messages()) {
    const auto frame = builder.frame();
    std::ofstream out(dir + "/" + name + ".frame", std::ios::binary);
    out.write(reinterpret_cast<const char*>(frame.data()), static_cast<std::streamsize>(frame.size()));
    stream.insert(stream.end(), reinterpret_cast<const char*>(frame.data()),
                  reinterpret_cast<const char*>(frame.data()) + frame.size());
    if (!out) return 1;
  }
  std::ofstream all(dir + "/all.stream", std::ios::binary);
  all.write(stream.data(), static_cast<std::streamsize>(stream.size()));
  return all ? 0 : 1;
}
