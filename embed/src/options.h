#pragma once
// Typed node options to the server's configuration (internal to the embedding library).

#include <string>

#include "core/status.h"
#include "kstate/kstate.h"
#include "server/config.h"

namespace kstate::embed::detail {

// The YAML document the options stand for (keys not given are left out).
std::string to_yaml(const node_options& o);
// The options checked by server::parse_config (errors start with "node_options: ",
// then the YAML key at fault); `settings` are applied as overrides, last.
kstate::result<server::app_config> to_config(const node_options& o);

}  // namespace kstate::embed::detail
