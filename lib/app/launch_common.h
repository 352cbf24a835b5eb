// What `spotvisor launch` does the same way on GCE (launch_command.cc) and
// EC2 (launch_ec2.cc): the spotvisor keys every VM of the run gets, checked
// before any call; the messages; the request ids.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "app/launch_command.h"
#include "common/status.h"

namespace spotvisor::launch {

constexpr int kExitUsage = 64;

// A value from the command line, quoted in a message: readable whatever
// its bytes, and not all of a long one.
std::string Shown(const std::string& s);

// "spotvisor launch: MESSAGE" on stderr; returns kExitUsage.
int UsageError(const std::string& message);

// A version-4 UUID: one per created thing (GCE's requestId, EC2's
// ClientToken), kept across its retries so a lost answer does not create
// it twice.
std::string RandomUuid();

// The spotvisor keys (without a prefix) every VM of the run gets, in order:
// run-id, bucket, each --set, the command (exec form: a JSON array).
// Unknown keys, run-id/bucket through --set, a command given twice or not
// at all are usage errors (kInvalidArgument).
StatusOr<std::vector<std::pair<std::string, std::string>>> RunKeys(const LaunchOptions& o);

// A flag of the other cloud given (`given` holds the flags used): the
// usage error, naming it and which cloud it is for; "" none.
std::string OtherCloudFlag(const LaunchOptions& o, const std::vector<std::string>& not_here, const char* cloud);

}  // namespace spotvisor::launch
