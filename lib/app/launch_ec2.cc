// `spotvisor launch` on EC2 (issue #30): a launch template and an Auto
// Scaling group of Spot instances, both named after the run, the EC2 form of
// docs/quickstart-aws.md "Unattended runs". The template carries no Spot
// request (a mixed instances policy refuses one); the group asks for Spot
// across --instance-types and --subnets, capacity-optimized, from a minimum
// of 0 so that a finished instance can lower the desired capacity when it
// leaves. spotvisor's keys travel in the user data's [spotvisor] section.
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "app/launch_command.h"
#include "app/launch_common.h"
#include "common/clock.h"
#include "common/strings.h"
#include "compute/aws_query.h"
#include "config/config_file.h"
#include "output/utf8.h"
#include "retry/sleeper.h"
#include "storage/aws_credentials.h"
#include "storage/crc32c.h"
#include "storage/s3_xml.h"
#include "storage/sigv4.h"

namespace spotvisor {
namespace {

using launch::Shown;
using launch::UsageError;
using Params = std::vector<std::pair<std::string, std::string>>;

constexpr char kHookName[] = "spotvisor-final-sync";
constexpr std::size_t kMaxUserData = 16 * 1024;  // EC2's limit, before base64

const SystemClock& TheClock() {
  static const SystemClock clock;
  return clock;
}

struct QueryRequest {
  const AwsQueryApi* api;
  const char* action;
  Params params;
  std::string what;   // "launch template RUN", for messages
  std::string scope;  // what the permission is needed on
};

bool IsLower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// PREFIX-hex: ami-0123abcd, subnet-..., sg-...
bool AwsId(const std::string& s, const std::string& prefix) {
  if (!StartsWith(s, prefix) || s.size() < prefix.size() + 8 || s.size() > prefix.size() + 17) return false;
  return s.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos;
}

// g5.xlarge, p4d.24xlarge, u-6tb1.metal
bool InstanceType(const std::string& s) {
  auto dot = s.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == s.size() || s.size() > 64) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i != dot && !IsLower(s[i]) && s[i] != '-') return false;
  }
  return true;
}

// us-east-1, eu-central-2, us-gov-west-1, ap-southeast-5
bool AwsRegion(const std::string& s) {
  auto parts = SplitOn(s, '-');
  if (parts.size() < 3 || s.size() > 32) return false;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto const& p = parts[i];
    bool last = i + 1 == parts.size();
    if (p.empty() || p.find_first_not_of(last ? "0123456789" : "abcdefghijklmnopqrstuvwxyz") != std::string::npos) return false;
  }
  return true;
}

// A run id that is also a launch template name (3 to 128 of
// [a-zA-Z0-9().-/_]) and an Auto Scaling group name.
bool Ec2RunId(const std::string& s) {
  if (s.size() < 3 || s.size() > 128 || !std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos;
}

// The user data: a comment and the [spotvisor] section (docs/configuration.md).
StatusOr<std::string> UserData(const LaunchOptions& o) {
  auto keys = launch::RunKeys(o);
  if (!keys.ok()) return keys.status();
  // The group's tag may not reach the instance metadata; the key does.
  if (!o.sets.count("group")) keys->emplace_back("group", o.run_id);
  std::string text = fmt::format(
      "# spotvisor launch {}: every instance of the group reads the [spotvisor] section (docs/configuration.md)\n"
      "[spotvisor]\n",
      o.run_id);
  for (auto const& [key, value] : *keys) text += key + " = " + QuoteConfigValue(value) + "\n";
  if (text.size() > kMaxUserData) {
    return InvalidArgumentError(fmt::format(
        "the user data would be {} bytes, over EC2's {} : shorten the command or the --set values", text.size(), kMaxUserData));
  }
  return text;
}

StatusOr<std::vector<QueryRequest>> BuildRequests(const LaunchOptions& o, const std::string& token,
                                                  std::string* user_data) {
  if (o.region.empty()) return InvalidArgumentError("--region is required (the region of the group, e.g. us-east-1)");
  if (!AwsRegion(o.region)) {
    return InvalidArgumentError(fmt::format("--region \"{}\" is not an AWS region (e.g. us-east-1)", Shown(o.region)));
  }
  if (!Ec2RunId(o.run_id)) {
    return InvalidArgumentError(fmt::format(
        "--run-id \"{}\" must be 3 to 128 letters, digits, '.', '_' or '-', a letter or digit first: it names the "
        "run, the launch template and the Auto Scaling group",
        Shown(o.run_id)));
  }
  if (o.bucket.size() <= 5) return InvalidArgumentError("--bucket must be s3://BUCKET[/PREFIX]");
  if (!AwsId(o.image, "ami-")) {
    return InvalidArgumentError(fmt::format("--image \"{}\": on EC2 an AMI id (ami-0123456789abcdef0) with spotvisor baked in",
                                            Shown(o.image)));
  }
  if (o.size < 1 || o.size > 1000) return InvalidArgumentError("--size must be 1 to 1000 (a gang of N: N)");
  if (o.instance_types.empty()) {
    return InvalidArgumentError("--instance-types is required: the types the trainer can run on, e.g. g5.xlarge,g6.xlarge "
                                "(more types are more Spot pools)");
  }
  if (o.instance_types.size() > 40) return InvalidArgumentError("--instance-types: at most 40");
  for (auto const& t : o.instance_types) {
    if (!InstanceType(t)) return InvalidArgumentError(fmt::format("--instance-types: \"{}\" is not an instance type (e.g. g5.xlarge)", Shown(t)));
  }
  if (o.subnets.empty()) {
    return InvalidArgumentError(
        "--subnets is required: one subnet per Availability Zone the group may use, e.g. the default ones: aws ec2 "
        "describe-subnets --filters Name=default-for-az,Values=true --query 'Subnets[].SubnetId'");
  }
  for (auto const& s : o.subnets) {
    if (!AwsId(s, "subnet-")) return InvalidArgumentError(fmt::format("--subnets: \"{}\" is not a subnet id (subnet-...)", Shown(s)));
  }
  for (auto const& s : o.security_groups) {
    if (!AwsId(s, "sg-")) return InvalidArgumentError(fmt::format("--security-groups: \"{}\" is not a security group id (sg-...)", Shown(s)));
  }
  if (o.allocation_strategy != "capacity-optimized" && o.allocation_strategy != "price-capacity-optimized" &&
      o.allocation_strategy != "capacity-optimized-prioritized" && o.allocation_strategy != "lowest-price") {
    return InvalidArgumentError("--allocation-strategy must be capacity-optimized, price-capacity-optimized, "
                                "capacity-optimized-prioritized or lowest-price");
  }
  if (o.terminating_hook_timeout != 0 && (o.terminating_hook_timeout < 30 || o.terminating_hook_timeout > 7200)) {
    return InvalidArgumentError("--terminating-hook-timeout must be 30s to 2h, or 0 for no hook");
  }
  auto text = UserData(o);
  if (!text.ok()) return text.status();
  *user_data = *text;

  Params lt = {{"ClientToken", token},
               {"LaunchTemplateName", o.run_id},
               {"VersionDescription", "spotvisor run " + o.run_id},
               {"LaunchTemplateData.ImageId", o.image},
               {"LaunchTemplateData.UserData", Base64Encode(*text)},
               // An instance that powers off (spotvisor when leaving is refused) ends its billing.
               {"LaunchTemplateData.InstanceInitiatedShutdownBehavior", "terminate"},
               {"LaunchTemplateData.MetadataOptions.HttpTokens", "required"},
               {"LaunchTemplateData.MetadataOptions.HttpEndpoint", "enabled"},
               // spotvisor reads the spotvisor-* tags and the group's tag there.
               {"LaunchTemplateData.MetadataOptions.InstanceMetadataTags", "enabled"}};
  if (!o.instance_profile.empty()) {
    bool arn = StartsWith(o.instance_profile, "arn:");
    lt.emplace_back(arn ? "LaunchTemplateData.IamInstanceProfile.Arn" : "LaunchTemplateData.IamInstanceProfile.Name",
                    o.instance_profile);
  }
  for (std::size_t i = 0; i < o.security_groups.size(); ++i) {
    lt.emplace_back(fmt::format("LaunchTemplateData.SecurityGroupId.{}", i + 1), o.security_groups[i]);
  }
  if (!o.key_name.empty()) lt.emplace_back("LaunchTemplateData.KeyName", o.key_name);
  lt.insert(lt.end(), {{"LaunchTemplateData.TagSpecification.1.ResourceType", "instance"},
                       {"LaunchTemplateData.TagSpecification.1.Tag.1.Key", "Name"},
                       {"LaunchTemplateData.TagSpecification.1.Tag.1.Value", o.run_id},
                       // A spotvisor key itself (instance tags are read as
                       // configuration), the same value as the user data's.
                       {"LaunchTemplateData.TagSpecification.1.Tag.2.Key", "spotvisor-run-id"},
                       {"LaunchTemplateData.TagSpecification.1.Tag.2.Value", o.run_id},
                       {"TagSpecification.1.ResourceType", "launch-template"},
                       {"TagSpecification.1.Tag.1.Key", "spotvisor-run-id"},
                       {"TagSpecification.1.Tag.1.Value", o.run_id}});

  std::string subnets;
  for (auto const& s : o.subnets) subnets += (subnets.empty() ? "" : ",") + s;
  Params asg = {{"AutoScalingGroupName", o.run_id},
                // 0: a finished instance lowers the desired capacity when it
                // leaves; at MinSize the call is refused and the group loops.
                {"MinSize", "0"},
                {"MaxSize", std::to_string(o.size)},
                {"DesiredCapacity", std::to_string(o.size)},
                {"VPCZoneIdentifier", subnets},
                // Off: it launches a second instance on the same run before
                // the first is gone (docs/unattended.md).
                {"CapacityRebalance", "false"},
                {"MixedInstancesPolicy.LaunchTemplate.LaunchTemplateSpecification.LaunchTemplateName", o.run_id},
                {"MixedInstancesPolicy.LaunchTemplate.LaunchTemplateSpecification.Version", "$Latest"}};
  for (std::size_t i = 0; i < o.instance_types.size(); ++i) {
    asg.emplace_back(fmt::format("MixedInstancesPolicy.LaunchTemplate.Overrides.member.{}.InstanceType", i + 1),
                     o.instance_types[i]);
  }
  asg.insert(asg.end(), {{"MixedInstancesPolicy.InstancesDistribution.OnDemandBaseCapacity", "0"},
                         {"MixedInstancesPolicy.InstancesDistribution.OnDemandPercentageAboveBaseCapacity", "0"},
                         {"MixedInstancesPolicy.InstancesDistribution.SpotAllocationStrategy", o.allocation_strategy},
                         // The group's own (its instances get theirs from the template).
                         {"Tags.member.1.Key", "spotvisor-run-id"},
                         {"Tags.member.1.Value", o.run_id},
                         {"Tags.member.1.PropagateAtLaunch", "false"},
                         {"Tags.member.1.ResourceId", o.run_id},
                         {"Tags.member.1.ResourceType", "auto-scaling-group"},
                         // Which launch made the group: a retry whose first try
                         // created it knows it by this.
                         {"Tags.member.2.Key", "spotvisor-launch"},
                         {"Tags.member.2.Value", token},
                         {"Tags.member.2.PropagateAtLaunch", "false"},
                         {"Tags.member.2.ResourceId", o.run_id},
                         {"Tags.member.2.ResourceType", "auto-scaling-group"}});
  if (o.terminating_hook_timeout > 0) {
    // When the group terminates an instance itself (scale-in), spotvisor
    // stops the trainer, syncs, and completes this hook's action.
    asg.insert(asg.end(), {{"LifecycleHookSpecificationList.member.1.LifecycleHookName", kHookName},
                           {"LifecycleHookSpecificationList.member.1.LifecycleTransition", "autoscaling:EC2_INSTANCE_TERMINATING"},
                           {"LifecycleHookSpecificationList.member.1.HeartbeatTimeout", std::to_string(o.terminating_hook_timeout)},
                           {"LifecycleHookSpecificationList.member.1.DefaultResult", "CONTINUE"}});
  }
  std::vector<QueryRequest> out;
  out.push_back({&kEc2QueryApi, "CreateLaunchTemplate", std::move(lt), "launch template " + o.run_id,
                 "launch templates in " + o.region});
  out.push_back({&kAutoScalingQueryApi, "CreateAutoScalingGroup", std::move(asg), "Auto Scaling group " + o.run_id,
                 fmt::format("groups in {} (and iam:PassRole on the instance profile's role, ec2:RunInstances, "
                             "ec2:CreateTags)",
                             o.region)});
  return out;
}

std::string Encode(const Params& params) {
  std::string out;
  for (auto const& [k, v] : params) {
    out += (out.empty() ? "" : "&") + AwsUriEncode(k, false) + "=" + AwsUriEncode(v, false);
  }
  return out;
}

std::string Ec2Endpoint(const std::string& region) {
  return AwsEndpoint("", {"AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"}, fmt::format("https://ec2.{}.amazonaws.com", region));
}
std::string AsgEndpoint(const std::string& region) {
  return AwsEndpoint("", {"AWS_ENDPOINT_URL_AUTO_SCALING", "AWS_ENDPOINT_URL"},
                     fmt::format("https://autoscaling.{}.amazonaws.com", region));
}

int Failed(const std::string& message) {
  std::fprintf(stderr, "spotvisor launch: %s\n", message.c_str());
  return 1;
}

}  // namespace

int LaunchEc2(const LaunchOptions& o) {
  if (auto flag = launch::OtherCloudFlag(o, {"--project", "--zone", "--zones", "--image-family", "--image-project", "--machine-type",
                                              "--accelerator", "--boot-disk-size", "--dataset-disk", "--dataset-snapshot", "--dataset-image",
                                              "--service-account",
                                              "--scopes", "--termination-action", "--compute-endpoint",
                                              "--access-token-command"},
                                         "EC2");
      !flag.empty()) {
    return UsageError(flag);
  }
  std::string token = launch::RandomUuid(), user_data;
  auto requests = BuildRequests(o, token, &user_data);
  if (!requests.ok()) return UsageError(requests.status().message());
  if (o.dry_run) {
    for (auto const& r : *requests) {
      std::printf("POST %s/ (%s %s)\n", (r.api == &kEc2QueryApi ? Ec2Endpoint(o.region) : AsgEndpoint(o.region)).c_str(),
                  r.api->title, r.action);
      // Whole: the user data is what the instances will read.
      for (auto const& [k, v] : r.params) std::printf("  %s=%s\n", k.c_str(), output::EscapeInvalidUtf8(v).c_str());
      if (r.api == &kEc2QueryApi) {
        std::printf("  (the user data, decoded:)\n");
        for (auto const& line : SplitLines(user_data)) std::printf("    %s\n", line.c_str());
      }
      std::printf("\n");
    }
    std::printf("dry run: nothing was created\n");
    return 0;
  }
  auto creds_ec2 = DefaultAwsCredentials(TheClock());
  auto creds_asg = DefaultAwsCredentials(TheClock());
  if (!creds_ec2.ok()) return Failed(creds_ec2.status().message());
  if (!creds_asg.ok()) return Failed(creds_asg.status().message());
  CancellableSleeper sleeper;
  AwsQueryClient ec2(kEc2QueryApi, Ec2Endpoint(o.region), o.region, std::move(*creds_ec2), sleeper, TheClock());
  AwsQueryClient asg(kAutoScalingQueryApi, AsgEndpoint(o.region), o.region, std::move(*creds_asg), sleeper, TheClock());
  auto ctx = [] { return Background().WithDeadline(std::chrono::steady_clock::now() + std::chrono::minutes(2)); };
  auto const& lt = (*requests)[0];
  auto const& group = (*requests)[1];

  std::fprintf(stderr, "spotvisor launch: creating %s ...\n", lt.what.c_str());
  // The ClientToken makes a repeated create answer the same template.
  Status s = ec2.Call(lt.action, Encode(lt.params), "create " + lt.what, lt.scope, ctx());
  if (!s.ok()) {
    if (s.code() == StatusCode::kFailedPrecondition) {
      return Failed(fmt::format("{}: the name is taken: an earlier launch of this run? pick another --run-id, or delete "
                                "it first: aws ec2 delete-launch-template --region {} --launch-template-name {}",
                                s.message(), o.region, o.run_id));
    }
    return Failed(s.message());
  }
  std::fprintf(stderr, "spotvisor launch: creating %s ...\n", group.what.c_str());
  s = asg.Call(group.action, Encode(group.params), "create " + group.what, group.scope, ctx());
  // Whether the group exists now, and is this launch's: a create that was
  // tried again after a lost answer finds it (AlreadyExists), and one that
  // ran out of tries may have made it all the same. nullopt: cannot tell.
  auto ours = [&]() -> std::optional<bool> {
    std::string xml;
    auto d = asg.Call("DescribeAutoScalingGroups", "AutoScalingGroupNames.member.1=" + AwsUriEncode(o.run_id, false),
                      "describe " + group.what, "groups in " + o.region, ctx(), &xml);
    if (!d.ok()) return std::nullopt;
    if (!XmlText(xml, "AutoScalingGroupName")) return false;  // no such group
    return xml.find(token) != std::string::npos;
  };
  bool taken = s.code() == StatusCode::kFailedPrecondition;
  if (taken || s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded) {
    auto mine = ours();
    if (!mine) {
      // Neither made for sure nor missing for sure: the template stays, as
      // a group may use it.
      return Failed(fmt::format(
          "{}; whether this launch made the group cannot be told now (describing it failed too). The launch template "
          "{} stays. Look: aws autoscaling describe-auto-scaling-groups --region {} --auto-scaling-group-names {}; if "
          "there is no group of this launch, delete the template: aws ec2 delete-launch-template --region {} "
          "--launch-template-name {}",
          s.message(), o.run_id, o.region, o.run_id, o.region, o.run_id));
    }
    if (*mine) {
      s = OkStatus();
    } else if (taken) {
      s = FailedPreconditionError(fmt::format(
          "{}: the name is taken: an earlier launch of this run? pick another --run-id, or delete it first: aws "
          "autoscaling delete-auto-scaling-group --region {} --auto-scaling-group-name {}",
          s.message(), o.region, o.run_id));
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "spotvisor launch: %s\n", s.message().c_str());
    // Nothing left behind: the template was made for this group only.
    auto d = ec2.Call("DeleteLaunchTemplate", "LaunchTemplateName=" + AwsUriEncode(o.run_id, false),
                      "delete " + lt.what, lt.scope, ctx());
    if (d.ok() || d.code() == StatusCode::kNotFound) {
      std::fprintf(stderr, "spotvisor launch: deleted %s again: nothing was left behind\n", lt.what.c_str());
    } else {
      std::fprintf(stderr,
                   "spotvisor launch: %s is left (deleting it failed: %s): aws ec2 delete-launch-template --region %s "
                   "--launch-template-name %s\n",
                   lt.what.c_str(), d.message().c_str(), o.region.c_str(), o.run_id.c_str());
    }
    return 1;
  }
  std::printf(
      "launched run %s: launch template %s and Auto Scaling group %s of %d (Spot, %s, %zu instance type(s) in %zu "
      "subnet(s)).\n"
      "  watch:   spotvisor runs %s\n"
      "           aws autoscaling describe-auto-scaling-groups --region %s --auto-scaling-group-names %s\n"
      "  stop:    spotvisor stop %s/%s\n"
      "When the run is over its instances leave the group (desired capacity 0); then delete the group and the "
      "template:\n"
      "  aws autoscaling delete-auto-scaling-group --region %s --auto-scaling-group-name %s && "
      "aws ec2 delete-launch-template --region %s --launch-template-name %s\n",
      o.run_id.c_str(), o.run_id.c_str(), o.run_id.c_str(), o.size, o.allocation_strategy.c_str(),
      o.instance_types.size(), o.subnets.size(), o.bucket.c_str(), o.region.c_str(), o.run_id.c_str(), o.bucket.c_str(),
      o.run_id.c_str(), o.region.c_str(), o.run_id.c_str(), o.region.c_str(), o.run_id.c_str());
  return 0;
}

}  // namespace spotvisor
