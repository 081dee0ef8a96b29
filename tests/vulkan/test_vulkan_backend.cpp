// Behaviour specific to the vulkan backend (filled in below).
#include <doctest/doctest.h>

#include "vk_test_util.h"

namespace cleave::test {
TEST_CASE("placeholder") {}
}  // namespace cleave::test
