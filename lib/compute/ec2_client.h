// The EC2 instance stopping or terminating itself through the EC2 Query API
// (StopInstances / TerminateInstances, SigV4, the instance role's
// credentials): what on-exit = stop | delete does on EC2.
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "compute/compute_client.h"
#include "retry/sleeper.h"
#include "storage/aws_credentials.h"

namespace spotvisor {

struct Ec2InstanceRef {
  std::string instance_id;
  std::string region;
};

// `endpoint` empty: AWS_ENDPOINT_URL_EC2, then AWS_ENDPOINT_URL, then
// https://ec2.REGION.amazonaws.com.
std::unique_ptr<ComputeClient> MakeEc2ComputeClient(std::string endpoint, Ec2InstanceRef instance,
                                                    std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                                    const Clock& clock);

// Leaving an Auto Scaling group (group.h). `endpoint` empty:
// AWS_ENDPOINT_URL_AUTO_SCALING, then AWS_ENDPOINT_URL, then
// https://autoscaling.REGION.amazonaws.com.
std::unique_ptr<GroupClient> MakeAsgClient(std::string endpoint, InstanceGroup group, Ec2InstanceRef instance,
                                           std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                           const Clock& clock);

// Instance tags on this instance (CreateTags), where an operator sees the
// run's phase in the console or `aws ec2 describe-tags` without ssh.
class Ec2Tagger {
 public:
  virtual ~Ec2Tagger() = default;
  virtual Status SetTag(const std::string& key, const std::string& value, const CallContext& ctx) = 0;
};
std::unique_ptr<Ec2Tagger> MakeEc2Tagger(std::string endpoint, Ec2InstanceRef instance,
                                         std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                         const Clock& clock);

// The region of an availability zone ("us-east-1a" -> "us-east-1"; local
// and wavelength zones "us-west-2-lax-1a" -> "us-west-2"); "" if unsure.
std::string RegionOfZone(const std::string& zone);

}  // namespace spotvisor
