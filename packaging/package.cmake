# What `cmake --install` puts where, and the Debian package CPack builds from it
# (scripts/package.sh; docs/packaging.md says why each choice was made).
include(GNUInstallDirs)

# The daemon's own install(TARGETS) rule (daemon/CMakeLists.txt) puts the binary in bin/.
install(FILES ${PROJECT_SOURCE_DIR}/systemd/spotvisor.service
        DESTINATION lib/systemd/system COMPONENT spotvisor)
install(FILES ${PROJECT_SOURCE_DIR}/README.md
              ${PROJECT_SOURCE_DIR}/docs/configuration.md
              ${PROJECT_SOURCE_DIR}/docs/packaging.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT spotvisor)

# /etc/spotvisor/spotvisor.conf is written by the binary just built (`config --template`),
# so it lists exactly the keys that binary knows, with their help and defaults, commented
# out; only `user = spotvisor` (the user the package creates) is set. Written at install
# time rather than at build time so that a plain (or sanitized) build never runs the binary.
set(SPOTVISOR_CONF_DIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/spotvisor)
install(CODE "
  set(conf_dir \"\$ENV{DESTDIR}${SPOTVISOR_CONF_DIR}\")
  file(MAKE_DIRECTORY \"\${conf_dir}\")
  execute_process(
    COMMAND \"$<TARGET_FILE:spotvisor>\" config --template --set user=spotvisor
    OUTPUT_FILE \"\${conf_dir}/spotvisor.conf\"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR \"spotvisor config --template failed (\${rc})\")
  endif()
  message(STATUS \"Generated: \${conf_dir}/spotvisor.conf\")
" COMPONENT spotvisor)

# ---- the .deb ----
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME spotvisor)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "spotvisor maintainers <maintainers@spotvisor.invalid>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "supervise deep-learning training on GCE Spot VMs")
# The synopsis is the summary above; CPack indents these lines and turns the empty one into " .".
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "spotvisor runs a training command as a systemd service on a Google Compute
Engine Spot or preemptible VM, configured through instance metadata
(spotvisor-* attributes) or /etc/spotvisor/spotvisor.conf. It watches the
metadata server for preemption and maintenance events and stops the trainer
gracefully (SIGINT, then SIGTERM, then SIGKILL), syncs checkpoints to Cloud
Storage and restores them at boot, writes its logs to Cloud Logging, and
powers the VM off when the run is over so that it stops billing.

The service is enabled on installation but not started: it starts at the
next boot (typically of an image baked with this package).")
# Depends is computed when cpack runs, by dpkg-shlibdeps on the built binary (see that file).
# With SPOTVISOR_PORTABLE the binary links only glibc, libcurl, libcrypto, libsystemd and libblkid
# dynamically (tests/package/run.sh checks that list).
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/packaging/spotvisor-binary.cmake
     CONTENT "set(SPOTVISOR_BINARY \"$<TARGET_FILE:spotvisor>\")\n")
set(CPACK_SPOTVISOR_BINARY_FILE ${PROJECT_BINARY_DIR}/packaging/spotvisor-binary.cmake)
set(CPACK_SPOTVISOR_SHLIBDEPS_DIR ${PROJECT_BINARY_DIR}/packaging/shlibdeps)
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/packaging/cpack-project-config.cmake)
# fuse3: the FUSE mounts (gcsfuse, rclone mount) need fusermount3 and /dev/fuse.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "fuse3")
# gcsfuse comes from Google's own apt repository, rclone from the distribution.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "gcsfuse, rclone, openssh-client, openssh-server, openmpi-bin")  # the last three: gang-launch = leader
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles
  ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
  ${PROJECT_SOURCE_DIR}/packaging/debian/prerm
  ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
# 0755 for the maintainer scripts, 0644 for conffiles, whatever the checkout's modes are.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
include(CPack)
