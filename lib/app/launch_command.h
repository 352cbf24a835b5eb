// `spotvisor launch` (issue #30): one command on a laptop creates what an
// unattended run needs on GCE and nothing more: an instance template (Spot,
// the termination action, the machine, GPUs, the image, the service account
// and scopes, the spotvisor-* metadata) and a managed instance group of 1 (or
// N for a gang) made from it, both named after the run. The group brings a
// preempted VM back; the VM leaves the group when the run is over
// (docs/unattended.md). --dry-run prints the API requests instead.
// EC2 (a launch template and an Auto Scaling group) is not there yet.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spotvisor {

struct LaunchOptions {
  std::string project;
  std::string zone, region;  // one of them: a zonal or a regional group
  std::string run_id;        // names the run, the template and the group
  std::string bucket;        // gs://BUCKET/PREFIX
  std::vector<std::string> command;  // the trainer (after --); or --set command=...
  std::string machine_type = "n1-standard-4";
  std::string accelerator;  // type=T,count=N ("" none)
  std::string image, image_family, image_project;
  int boot_disk_gb = 100;
  std::string dataset_disk;  // an existing zonal disk, attached read-only (zonal groups only)
  std::string service_account;  // "" the project's default
  std::string scopes = "cloud-platform";
  int size = 1;
  std::string termination_action = "DELETE";  // DELETE | STOP
  std::map<std::string, std::string> sets;  // --set KEY=VALUE: spotvisor-KEY metadata
  std::string compute_endpoint = "https://compute.googleapis.com/compute/v1";
  std::string access_token_command;
  bool dry_run = false;
};

// Exit codes: 0 launched (or printed); 1 an API call failed (the message
// names the resource and the fix; a template made for a group that could
// not be made is deleted again); 64 usage.
int Launch(const LaunchOptions& options);

}  // namespace spotvisor
