# The installed package: `cmake --install <build> --prefix <dir>` puts
#   include/kstate/        the public headers (kstate.h, version.h), nothing else
#   lib/                   the static libraries (kstate::kstate and the modules it links)
#   lib/cmake/kstate/      kstateConfig.cmake, kstateConfigVersion.cmake, kstateTargets.cmake
#   lib/pkgconfig/kstate.pc
#   bin/kstate             the server
# An application then uses find_package(kstate) and links kstate::kstate
# (docs/embedding.md).
include(CMakePackageConfigHelpers)

install(TARGETS kstate RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT kstateTargets NAMESPACE kstate:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kstate)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kstateConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kstateConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kstate)
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kstateConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kstateConfig.cmake ${PROJECT_BINARY_DIR}/kstateConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kstate)

# pkg-config: the libraries in link order (the embedding facade first, core last), then
# the system libraries they need (`pkg-config --cflags --libs kstate`).
# The way up from the .pc file's directory to the prefix ("../.." for lib/pkgconfig).
file(RELATIVE_PATH KSTATE_PC_UP /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${PROJECT_SOURCE_DIR}/cmake/kstate.pc.in ${PROJECT_BINARY_DIR}/kstate.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kstate.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
