# What `cmake --install <build> [--prefix P]` puts where (GNUInstallDirs):
#
#   bin/gradd, bin/graddctl                     the daemon and its admin CLI
#   libexec/gradd/gradd                         the daemon again, for the wheel's
#                                               `gradd` command (gradd run)
#   lib*/libgradd_client.so.N[.M.P] (+ .so)      the trainer library
#   include/gradd/{client,gradd,version}.h      its public headers
#   lib*/cmake/gradd/                           find_package(gradd) ->
#                                               gradd::client
#   lib*/pkgconfig/gradd.pc                     pkg-config gradd
#   lib/systemd/system/gradd.service            ExecStart = this prefix's gradd
#   share/gradd/gradd.yaml, share/gradd/k8s/    example config, manifests
#   share/gradd/systemd/gradd-multinode.conf    drop-in: multi-node credentials
#
# Components: Runtime (daemon, CLI, library, unit) and Development
# (headers, namelink, CMake package, gradd.pc).
include(CMakePackageConfigHelpers)

set(GRADD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gradd)

install(TARGETS gradd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT Runtime)
# The same daemon where the Python package's `gradd` command (gradd run's
# dispatcher, client/python/gradd/run/cli.py) finds it should a pip install
# into this prefix replace bin/gradd with that command.
install(TARGETS gradd RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/gradd
        COMPONENT Runtime)
# graddctl comes with the admin service (tools/graddctl).
if(TARGET graddctl)
  install(TARGETS graddctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          COMPONENT Runtime)
endif()

install(TARGETS gradd_client EXPORT gradd-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime
          NAMELINK_COMPONENT Development)
install(FILES
    ${PROJECT_SOURCE_DIR}/client/include/gradd/client.h
    ${PROJECT_SOURCE_DIR}/client/include/gradd/collectives.h
    ${PROJECT_SOURCE_DIR}/client/include/gradd/gradd.h
    ${PROJECT_BINARY_DIR}/client/include/gradd/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gradd COMPONENT Development)

# The CMake package: gradd::client carries its include directory and its
# public dependency (Abseil's status types), found again by find_dependency.
install(EXPORT gradd-targets NAMESPACE gradd::
  DESTINATION ${GRADD_CMAKE_DIR} COMPONENT Development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/gradd-config.cmake.in
  ${PROJECT_BINARY_DIR}/gradd-config.cmake
  INSTALL_DESTINATION ${GRADD_CMAKE_DIR})
# 0.x: minor versions may break the API; from 1.0 on, same major.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_gradd_compat SameMinorVersion)
else()
  set(_gradd_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gradd-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${_gradd_compat})
install(FILES ${PROJECT_BINARY_DIR}/gradd-config.cmake
              ${PROJECT_BINARY_DIR}/gradd-config-version.cmake
  DESTINATION ${GRADD_CMAKE_DIR} COMPONENT Development)

# gradd.pc, relocatable: the prefix is found from the file's own place, so
# `cmake --install --prefix P` anywhere gives a working file.
file(RELATIVE_PATH _gradd_pc_to_prefix
  ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" _gradd_pc_to_prefix "${_gradd_pc_to_prefix}")
set(GRADD_PC_PREFIX "\${pcfiledir}/${_gradd_pc_to_prefix}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/gradd.pc.in
  ${PROJECT_BINARY_DIR}/gradd.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/gradd.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)

# The systemd unit, its ExecStart pointing at the gradd installed here
# (rewritten at install time: --prefix may differ from the configured one).
# systemd looks in <prefix>/lib/systemd/system for /usr and /usr/local.
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/gradd.service\" _unit)
  string(REPLACE \"/usr/local/bin/gradd \"
         \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/gradd \"
         _unit \"\${_unit}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/gradd.service.installed\" \"\${_unit}\")
" COMPONENT Runtime)
install(FILES ${PROJECT_BINARY_DIR}/gradd.service.installed
  DESTINATION lib/systemd/system RENAME gradd.service COMPONENT Runtime)
# The multi-node drop-in (credentials through LoadCredential=), the same
# rewrite, as an example to copy to /etc/systemd/system/gradd.service.d/.
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/gradd-multinode.conf\" _dropin)
  string(REPLACE \"/usr/local/bin/gradd \"
         \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/gradd \"
         _dropin \"\${_dropin}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/gradd-multinode.conf.installed\" \"\${_dropin}\")
" COMPONENT Runtime)
install(FILES ${PROJECT_BINARY_DIR}/gradd-multinode.conf.installed
  DESTINATION ${CMAKE_INSTALL_DATADIR}/gradd/systemd
  RENAME gradd-multinode.conf COMPONENT Runtime)
# The rendezvous on etcd (docs/operations.md): the drop-in adding the
# daemon's etcd client certificate, its gradd.yaml, and /etc/default/etcd
# for a member run by Debian's etcd-server; examples, as above.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/gradd-etcd.conf
  ${PROJECT_SOURCE_DIR}/deploy/systemd/gradd-etcd.yaml
  ${PROJECT_SOURCE_DIR}/deploy/systemd/etcd.default
  DESTINATION ${CMAKE_INSTALL_DATADIR}/gradd/systemd COMPONENT Runtime)

install(FILES ${PROJECT_SOURCE_DIR}/config/gradd.yaml
  DESTINATION ${CMAKE_INSTALL_DATADIR}/gradd COMPONENT Runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/k8s/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/gradd/k8s COMPONENT Runtime
  FILES_MATCHING PATTERN "*.yaml")
