// Fuzz target: the configuration loader (server/src/config.cc) on YAML text.
//
// Any text gives a configuration or an error, never a crash or an exception that
// escapes. A configuration that loads renders (render_config, what --check-config
// prints) to YAML that loads again to the same rendering.

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "server/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = kstate::server::parse_config(text, "fuzz.yaml");
  if (!cfg.ok()) return 0;
  const std::string rendered = kstate::server::render_config(*cfg);
  auto again = kstate::server::parse_config(rendered, "rendered.yaml");
  if (!again.ok()) std::fprintf(stderr, "%s\n", again.error().message().c_str());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(kstate::server::render_config(*again) == rendered);
  return 0;
}
