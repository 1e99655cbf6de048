#pragma once
// The secret the instances of one group share to recognise each other's requests
// (server/src/api/peer_auth.h), kept in Kafka so that every instance of the group has
// it without configuration, and nobody who can only reach the HTTP API does.
//
// It lives in the topic `<application_id>-peer-secret` (one partition, records never
// deleted), which kstate creates. The first record of the topic is the secret: an
// instance that finds the topic empty writes a random one, then every instance reads
// the first record, so instances starting at the same time still agree. Who may read
// that topic may speak to the instances as a peer: give its ACLs to kstate's principal
// only (docs/security.md).

#include <chrono>
#include <string>

#include "core/status.h"
#include "ingest/engine.h"

namespace kstate::ingest {

// The topic holding the group's secret.
std::string group_secret_topic(const std::string& application_id);

// Reads the group's secret, creating the topic and writing a secret when there is
// none. Blocks up to `timeout`; errors name what failed (e.g. missing ACLs).
result<std::string> read_group_secret(const ingest_config& cfg, std::chrono::milliseconds timeout);

}  // namespace kstate::ingest
