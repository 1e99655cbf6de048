# kstate_warnings(<target>): the warnings every kstate target is built with; errors
# with -DKSTATE_WERROR=ON (CI builds that way).
function(kstate_warnings target)
  # Designated initializers that leave members at their defaults are the idiom here.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  if(KSTATE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# kstate_cc_library(NAME <module> SRCS ... [DEPS ...] [PRIVATE_DEPS ...])
#
# Declares one library per module with the alias kstate::<module>. Public headers live
# in <module>/include/<module>/ and are included as "<module>/header.h"; everything in
# PRIVATE_DEPS (RocksDB for storage, librdkafka for ingest) stays behind the module.
#
# Every module library is installed and exported (kstateTargets, as kstate::<module>),
# because the embedding library kstate::kstate links them statically; their headers
# are not: the include directory is a build-tree one only, so an application building
# against an installed kstate sees <kstate/kstate.h> and nothing else (docs/embedding.md).
function(kstate_cc_library)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kstate_${K_NAME} STATIC ${K_SRCS})
  add_library(kstate::${K_NAME} ALIAS kstate_${K_NAME})
  set_target_properties(kstate_${K_NAME} PROPERTIES EXPORT_NAME ${K_NAME})
  target_include_directories(kstate_${K_NAME}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(kstate_${K_NAME} PUBLIC ${K_DEPS} PRIVATE ${K_PRIVATE_DEPS})
  kstate_warnings(kstate_${K_NAME})
  install(TARGETS kstate_${K_NAME} EXPORT kstateTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# kstate_cc_test(NAME <name> SRCS ... DEPS ... [LABELS ...])
# One doctest executable per module, linked only to that module so a layering mistake
# fails to link.
function(kstate_cc_test)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${K_NAME} ${K_SRCS})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS} doctest::doctest)
  kstate_warnings(${K_NAME})
  add_test(NAME ${K_NAME} COMMAND ${K_NAME})
  if(K_LABELS)
    set_tests_properties(${K_NAME} PROPERTIES LABELS "${K_LABELS}")
  endif()
endfunction()
