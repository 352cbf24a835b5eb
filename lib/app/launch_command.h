// `spotvisor launch` (issue #30): one command on a laptop creates what an
// unattended run needs on GCE and nothing more: an instance template (Spot,
// the termination action, the machine, GPUs, the image, the service account
// and scopes, the spotvisor-* metadata) and a managed instance group of 1 (or
// N for a gang) made from it, both named after the run. The group brings a
// preempted VM back; the VM leaves the group when the run is over
// (docs/unattended.md). On EC2 (an s3:// bucket) the same is a launch
// template and an Auto Scaling group of Spot instances across subnets
// (launch_ec2.cc). --dry-run prints the API requests instead.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spotvisor {

struct LaunchOptions {
  std::string project;
  std::string zone, region;  // one of them: a zonal or a regional group
  std::vector<std::string> zones;  // a regional group: the zones it may use ("" all of the region's)
  std::string run_id;        // names the run, the template and the group
  std::string bucket;        // gs://BUCKET/PREFIX (GCE) | s3://BUCKET/PREFIX (EC2)
  std::vector<std::string> command;  // the trainer (after --); or --set command=...
  std::string machine_type = "n1-standard-4";
  std::string accelerator;  // type=T,count=N ("" none)
  std::string image, image_family, image_project;  // EC2: image is the AMI id
  int boot_disk_gb = 100;
  std::string dataset_disk;  // an existing disk, read-only: NAME (zonal) or regions/R/disks/NAME (regional)
  std::string dataset_snapshot, dataset_image;  // or a disk made for each VM in its zone from one of these
  std::string service_account;  // "" the project's default
  std::string scopes = "cloud-platform";
  int size = 1;
  std::string termination_action = "DELETE";  // DELETE | STOP
  std::map<std::string, std::string> sets;  // --set KEY=VALUE: spotvisor-KEY metadata
  std::string compute_endpoint = "https://compute.googleapis.com/compute/v1";
  std::string access_token_command;
  bool dry_run = false;
  // EC2 only. The region is `region`; the AMI `image`.
  std::vector<std::string> instance_types;  // the group's Spot pools, in order of preference
  std::vector<std::string> subnets;         // one per Availability Zone the group may use
  std::string instance_profile;             // a name, or an ARN
  std::vector<std::string> security_groups;
  std::string key_name;
  std::string allocation_strategy = "capacity-optimized";
  int terminating_hook_timeout = 300;  // seconds the final sync may take when the group terminates a VM; 0 no hook
  // The flags given on the command line ("--zone", ...), so that one meant
  // for the other cloud is a usage error, not silently ignored.
  std::vector<std::string> flags_given;
};

// Exit codes: 0 launched (or printed); 1 an API call failed (the message
// names the resource and the fix; a template made for a group that could
// not be made is deleted again); 64 usage. The bucket's scheme picks the
// cloud: gs:// GCE, s3:// EC2.
int Launch(const LaunchOptions& options);
int LaunchEc2(const LaunchOptions& options);

}  // namespace spotvisor
