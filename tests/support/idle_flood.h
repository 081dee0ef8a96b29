// Plain TCP connections that never speak: a flood of idle connections for the listener tests.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::testing {

// A TCP connection to 127.0.0.1:`port` from the 127.0.0.x address `source`; -1 when refused.
inline int connect_from(const std::string& source, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// `n` connections to 127.0.0.1:`port` from the 127.0.0.x addresses `source(i)` names (raises the
// open-file limit to its hard limit first), closed on destruction.
class idle_flood {
 public:
  template <class Source>
  idle_flood(std::uint16_t port, int n, Source source) {
    rlimit lim{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
    if (lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
    REQUIRE_MESSAGE(lim.rlim_cur > static_cast<rlim_t>(2 * n + 200), "too few file descriptors for the flood");
    for (int i = 0; i < n; ++i) {
      const int fd = connect_from(source(i), port);
      REQUIRE(fd >= 0);
      fds_.push_back(fd);
    }
  }
  ~idle_flood() {
    for (int fd : fds_) ::close(fd);
  }
  idle_flood(const idle_flood&) = delete;
  idle_flood& operator=(const idle_flood&) = delete;

 private:
  std::vector<int> fds_;
};

}  // namespace cleave::testing
