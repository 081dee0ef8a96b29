# Cross-compiling for arm64 (aarch64) Linux with Debian's cross toolchain
# (crossbuild-essential-arm64) and multiarch arm64 packages (dpkg --add-architecture arm64).
# scripts/cross-arm64.sh installs both and passes this file as CMAKE_TOOLCHAIN_FILE.
#
# Libraries and their CMake packages come from /usr/lib/aarch64-linux-gnu (multiarch), headers
# from /usr/include; programs run during the build (flatc, glslc) are the host's. An arm64
# -dev package that cannot be installed next to its amd64 twin is unpacked into a folder whose
# usr/ is given in CMAKE_PREFIX_PATH: it is searched before the system.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Build tools are host programs; libraries, headers and packages are the target's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config (FindOpenSSL asks it first) must read the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# What is built for the target runs here under qemu-user (qemu-user-static), on the multiarch
# arm64 C library (libc6:arm64, /lib/ld-linux-aarch64.so.1) that the arm64 packages need. Not
# with `-L /usr/aarch64-linux-gnu`: that loads the cross toolchain's dynamic loader, another
# build of glibc, beside libc6:arm64's libc.so.6, and the first pthread_create never returns.
find_program(CLEAVE_QEMU_AARCH64 qemu-aarch64-static)
if(CLEAVE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CLEAVE_QEMU_AARCH64})
endif()
