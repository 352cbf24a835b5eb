# Included by cpack for each generator (CPACK_PROJECT_CONFIG_FILE), once the binary is built.
# Depends is what dpkg-shlibdeps computes from the binary and Debian's symbols files: the
# packages of the shared libraries it links, each with the oldest version that has every
# symbol it uses (libc6 (>= 2.35) from the GLIBC_ versions, libcurl4 (>= 7.68.0) for
# curl_multi_wakeup, ...). So Depends follows the code, and cannot claim less than it needs.
if(CPACK_GENERATOR STREQUAL "DEB")
  include("${CPACK_SPOTVISOR_BINARY_FILE}")  # sets SPOTVISOR_BINARY
  set(dir "${CPACK_SPOTVISOR_SHLIBDEPS_DIR}")
  file(MAKE_DIRECTORY "${dir}/debian")
  file(WRITE "${dir}/debian/control" "Source: spotvisor\n\nPackage: spotvisor\nArchitecture: any\n")
  find_program(dpkg_shlibdeps dpkg-shlibdeps REQUIRED)
  execute_process(COMMAND "${dpkg_shlibdeps}" -O "${SPOTVISOR_BINARY}"
    WORKING_DIRECTORY "${dir}" OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "shlibs:Depends=")
    message(FATAL_ERROR "dpkg-shlibdeps ${SPOTVISOR_BINARY} failed (${rc}): ${err}")
  endif()
  string(REGEX REPLACE "^.*shlibs:Depends=([^\n]*).*$" "\\1" deps "${out}")
  # Ubuntu 24.04 and Debian 13 ship libcurl as libcurl4t64, which Provides libcurl4 with its
  # own version, so `libcurl4 (>= X)` already matches there; the explicit alternative is for
  # readers and for resolvers that ignore versioned Provides.
  string(REGEX REPLACE "(libcurl4 \\([^)]*\\))" "\\1 | libcurl4t64" deps "${deps}")
  # libssl3 (libcrypto.so.3, for service-account keys) is libssl3t64 there, the same way.
  string(REGEX REPLACE "(libssl3 \\([^)]*\\))" "\\1 | libssl3t64" deps "${deps}")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "${deps}")
  message(STATUS "Depends: ${deps}")
endif()
