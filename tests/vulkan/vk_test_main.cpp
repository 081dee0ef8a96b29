// doctest main for the vulkan tests: turns on the Khronos validation layer (when installed)
// before any Vulkan instance exists, so every test also checks the API usage.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("CLEAVE_VK_VALIDATION", "1", 0);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
