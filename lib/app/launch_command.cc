#include "app/launch_command.h"

#include "app/laptop_credentials.h"
#include "app/launch_common.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/json_fields.h"
#include "common/strings.h"
#include "http/http_client.h"
#include "output/utf8.h"
#include "storage/token_provider.h"
#include "storage/user_credentials.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;
using launch::Shown;
using launch::UsageError;
constexpr char kMadeDatasetDisk[] = "dataset";  // its device name: /dev/disk/by-id/google-dataset

const SystemClock& TheClock() {
  static const SystemClock clock;
  return clock;
}

// A GCE resource name: [a-z]([-a-z0-9]*[a-z0-9])?
bool GceName(const std::string& s, std::size_t max) {
  if (s.empty() || s.size() > max || s.front() < 'a' || s.front() > 'z' || s.back() == '-') return false;
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
}

// gcloud's scope aliases, as `--scopes` takes them.
std::string ScopeUrl(const std::string& s) {
  static const std::map<std::string, std::string> kAliases = {
      {"cloud-platform", "cloud-platform"}, {"storage-rw", "devstorage.read_write"},
      {"storage-ro", "devstorage.read_only"}, {"storage-full", "devstorage.full_control"},
      {"logging-write", "logging.write"},   {"monitoring-write", "monitoring.write"},
      {"compute-rw", "compute"},            {"compute-ro", "compute.readonly"}};
  if (StartsWith(s, "https://")) return s;
  auto it = kAliases.find(s);
  return it == kAliases.end() ? "" : "https://www.googleapis.com/auth/" + it->second;
}

struct Request {
  std::string method, path;  // path: after the endpoint
  Json body;
  std::string what;      // "instance template NAME", for messages
  std::string permission;
};

// The template and the group, as the API takes them.
StatusOr<std::vector<Request>> BuildRequests(const LaunchOptions& o) {
  if (o.project.empty()) return InvalidArgumentError("--project is required");
  if (o.zone.empty() == o.region.empty()) return InvalidArgumentError("give one of --zone (a zonal group) or --region (a regional one)");
  // The group names its VMs RUN-xxxx: 58 characters leave room for that.
  if (!GceName(o.run_id, 58)) {
    return InvalidArgumentError(fmt::format(
        "--run-id \"{}\" must be a Compute Engine name of at most 58 characters (lower-case letters, digits and '-', "
        "a letter first): it names the run, the template, the group and its VMs",
        Shown(o.run_id)));
  }
  if (!StartsWith(o.bucket, "gs://") || o.bucket.size() <= 5) {
    return InvalidArgumentError(
        "--bucket must be gs://BUCKET[/PREFIX] (GCE) or s3://BUCKET[/PREFIX] (EC2): where the run's checkpoints and record live");
  }
  if (o.size < 1 || o.size > 1000) return InvalidArgumentError("--size must be 1 to 1000 (a gang of N: N)");
  if (o.termination_action != "DELETE" && o.termination_action != "STOP") {
    return InvalidArgumentError("--termination-action must be DELETE (the group recreates a fresh VM) or STOP");
  }
  if (o.image.empty() == o.image_family.empty()) return InvalidArgumentError("give one of --image or --image-family");
  if (o.boot_disk_gb < 10 || o.boot_disk_gb > 65536) return InvalidArgumentError("--boot-disk-size must be 10 to 65536 (GB)");
  // An existing disk: a zonal one by name, or a regional one by its URL
  // (what an instance template takes for each).
  std::string disk_name, regional_disk;
  if (!o.dataset_disk.empty()) {
    auto parts = SplitOn(o.dataset_disk, '/');
    if (parts.size() == 6 && parts[0] == "projects" && parts[2] == "regions" && parts[4] == "disks") {
      parts.erase(parts.begin(), parts.begin() + 2);
    }
    if (parts.size() == 4 && parts[0] == "regions" && parts[2] == "disks" && GceName(parts[1], 63) && GceName(parts[3], 63)) {
      disk_name = parts[3];
      regional_disk = fmt::format("projects/{}/regions/{}/disks/{}", o.project, parts[1], parts[3]);
      if (StartsWith(o.dataset_disk, "projects/")) regional_disk = o.dataset_disk;
      std::string group_region = !o.region.empty() ? o.region : o.zone.substr(0, o.zone.rfind('-'));
      if (parts[1] != group_region) {
        return InvalidArgumentError(fmt::format("--dataset-disk {}: the regional disk is in {}, the group in {}",
                                                Shown(o.dataset_disk), parts[1], group_region));
      }
      if (!o.region.empty() && o.zones.empty()) {
        return InvalidArgumentError(fmt::format(
            "--dataset-disk {}: a regional disk lives in two zones of {}; give them as --zones (gcloud compute disks "
            "describe {} --region {} --format='value(replicaZones)') so the group creates its VMs only there",
            Shown(o.dataset_disk), o.region, parts[3], parts[1]));
      }
    } else if (GceName(o.dataset_disk, 63)) {
      disk_name = o.dataset_disk;
      if (!o.region.empty()) {
        // Issue #30 point 7: refused here, before anything is created.
        return InvalidArgumentError(fmt::format(
            "--dataset-disk {}: a regional group creates its VMs in any zone of {}, and a zonal disk exists in one "
            "zone only. Use --zone (the disk's zone); or a regional disk (--dataset-disk regions/{}/disks/NAME with "
            "--zones, its two zones); or --dataset-snapshot / --dataset-image, which give each VM a disk of its own "
            "made in its zone; or give the dataset through the bucket mount (--set bucket-mount=/mnt/bucket), or "
            "bake it into the image",
            o.dataset_disk, o.region, o.region));
      }
    } else {
      return InvalidArgumentError(fmt::format(
          "--dataset-disk \"{}\" is not a disk name (a zonal disk) or regions/REGION/disks/NAME (a regional one)",
          Shown(o.dataset_disk)));
    }
  }
  if (!o.zones.empty()) {
    if (o.region.empty()) return InvalidArgumentError("--zones is for a regional group (--region): the zones it may use");
    for (auto const& z : o.zones) {
      if (!StartsWith(z, o.region + "-") || !GceName(z, 63)) {
        return InvalidArgumentError(fmt::format("--zones: \"{}\" is not a zone of {}", Shown(z), o.region));
      }
    }
  }
  // A disk made for each VM, in its zone, from a snapshot or an image: what
  // works in a regional group (issue #30 point 7).
  std::string made_from;
  if (!o.dataset_snapshot.empty() || !o.dataset_image.empty()) {
    if (!o.dataset_snapshot.empty() + !o.dataset_image.empty() + !o.dataset_disk.empty() > 1) {
      return InvalidArgumentError("give one of --dataset-disk, --dataset-snapshot and --dataset-image");
    }
    bool snapshot = !o.dataset_snapshot.empty();
    const std::string& source = snapshot ? o.dataset_snapshot : o.dataset_image;
    if (GceName(source, 63)) {
      made_from = fmt::format("projects/{}/global/{}/{}", o.project, snapshot ? "snapshots" : "images", source);
    } else if ((StartsWith(source, "projects/") || StartsWith(source, "global/")) &&
               source.find_first_of(" \"\\?#") == std::string::npos && source.size() <= 300) {
      made_from = source;
    } else {
      return InvalidArgumentError(fmt::format("--dataset-{} \"{}\": a name in the project, or projects/P/global/{}/NAME",
                                              snapshot ? "snapshot" : "image", Shown(source), snapshot ? "snapshots" : "images"));
    }
  }
  if ((!o.dataset_disk.empty() || !made_from.empty()) && o.sets.count("dataset-disk")) {
    return InvalidArgumentError("the dataset disk is given twice (--dataset-disk/--dataset-snapshot/--dataset-image and --set dataset-disk=)");
  }
  Json items = Json::array();
  auto add = [&](const std::string& k, const std::string& v) { items.push_back({{"key", k}, {"value", v}}); };
  auto keys = launch::RunKeys(o);
  if (!keys.ok()) return keys.status();
  for (auto const& [key, value] : *keys) add("spotvisor-" + key, value);
  if (!disk_name.empty()) add("spotvisor-dataset-disk", disk_name);
  if (!made_from.empty()) add("spotvisor-dataset-disk", kMadeDatasetDisk);
  add("enable-guest-attributes", "TRUE");
  Json scopes = Json::array();
  for (auto const& s : SplitOn(o.scopes, ',')) {
    auto url = ScopeUrl(std::string(Trim(s)));
    if (url.empty()) return InvalidArgumentError(fmt::format("--scopes: \"{}\" is not a scope URL or alias (cloud-platform, storage-rw, logging-write, compute-rw, ...)", Shown(s)));
    scopes.push_back(url);
  }
  Json properties = {
      {"machineType", o.machine_type},
      {"scheduling",
       {{"provisioningModel", "SPOT"},
        {"instanceTerminationAction", o.termination_action},
        {"onHostMaintenance", "TERMINATE"},
        {"automaticRestart", false}}},
      {"disks",
       {{{"boot", true},
         {"autoDelete", true},
         {"type", "PERSISTENT"},
         {"initializeParams",
          {{"sourceImage", o.image.empty() ? fmt::format("projects/{}/global/images/family/{}",
                                                         o.image_project.empty() ? o.project : o.image_project,
                                                         o.image_family)
                                           : o.image},
           {"diskSizeGb", std::to_string(o.boot_disk_gb)}}}}}},
      {"networkInterfaces", {{{"network", "global/networks/default"}, {"accessConfigs", {{{"name", "External NAT"}, {"type", "ONE_TO_ONE_NAT"}}}}}}},
      {"serviceAccounts", {{{"email", o.service_account.empty() ? "default" : o.service_account}, {"scopes", scopes}}}},
      {"metadata", {{"items", items}}},
      {"labels", {{"spotvisor-run", o.run_id}}}};
  if (!disk_name.empty()) {
    // An existing disk, read-only, so every VM of the group (a gang) can
    // have it at once.
    properties["disks"].push_back({{"boot", false},
                                   {"autoDelete", false},
                                   {"type", "PERSISTENT"},
                                   {"mode", "READ_ONLY"},
                                   {"deviceName", disk_name},
                                   {"source", regional_disk.empty() ? disk_name : regional_disk}});
  }
  if (!made_from.empty()) {
    // Made with the VM in whatever zone it gets, deleted with it: each VM
    // of a gang has its own. spotvisor mounts it read-only all the same.
    properties["disks"].push_back(
        {{"boot", false},
         {"autoDelete", true},
         {"type", "PERSISTENT"},
         {"mode", "READ_WRITE"},
         {"deviceName", kMadeDatasetDisk},
         {"initializeParams", {{!o.dataset_snapshot.empty() ? "sourceSnapshot" : "sourceImage", made_from}}}});
  }
  if (!o.accelerator.empty()) {
    std::string type;
    int count = 1;
    for (auto const& part : SplitOn(o.accelerator, ',')) {
      auto eq = part.find('=');
      std::string k = part.substr(0, eq), v = eq == std::string::npos ? "" : part.substr(eq + 1);
      if (k == "type" && !v.empty()) {
        type = v;
      } else if (k == "count" && !v.empty() && v.size() <= 2 && v.find_first_not_of("0123456789") == std::string::npos) {
        count = std::stoi(v);
      } else {
        return InvalidArgumentError(fmt::format("--accelerator \"{}\": expected type=TYPE[,count=N]", Shown(o.accelerator)));
      }
    }
    if (type.empty() || count < 1) return InvalidArgumentError("--accelerator needs type=TYPE (and count >= 1)");
    properties["guestAccelerators"] = {{{"acceleratorType", type}, {"acceleratorCount", count}}};
  }
  std::vector<Request> out;
  out.push_back({"POST", fmt::format("/projects/{}/global/instanceTemplates", o.project),
                 {{"name", o.run_id}, {"description", "spotvisor run " + o.run_id}, {"properties", properties}},
                 "instance template " + o.run_id, "compute.instanceTemplates.create"});
  std::string where = o.zone.empty() ? fmt::format("regions/{}", o.region) : fmt::format("zones/{}", o.zone);
  Json group = {{"name", o.run_id},
                {"description", "spotvisor run " + o.run_id + " (it leaves the group when the run is over)"},
                {"baseInstanceName", o.run_id},
                {"instanceTemplate", fmt::format("projects/{}/global/instanceTemplates/{}", o.project, o.run_id)},
                {"targetSize", o.size}};
  if (!o.zones.empty()) {
    Json zones = Json::array();
    for (auto const& z : o.zones) zones.push_back({{"zone", fmt::format("zones/{}", z)}});
    group["distributionPolicy"] = {{"zones", zones}};
  }
  out.push_back({"POST", fmt::format("/projects/{}/{}/instanceGroupManagers", o.project, where), group,
                 fmt::format("{} managed instance group {}", o.zone.empty() ? "regional" : "zonal", o.run_id),
                 "compute.instanceGroupManagers.create"});
  return out;
}

StatusOr<std::unique_ptr<TokenProvider>> Credentials(const LaunchOptions& o) {
  // A service-account key is asked for what a template and a group need.
  return LaptopGoogleCredentials(o.access_token_command, kCloudPlatformScope);
}

class Api {
 public:
  Api(std::string endpoint, std::unique_ptr<TokenProvider> tokens)
      : endpoint_(std::move(endpoint)), tokens_(std::move(tokens)), http_(MakeCurlHttpClient()) {}

  // One request; 429/5xx and transport errors are tried again (3 times in
  // all) with the same requestId, which makes a repeated insert harmless.
  StatusOr<Json> Call(const std::string& method, const std::string& path, const Json* body, const std::string& what,
                      const std::string& permission) {
    std::string url = endpoint_ + path;
    if (method != "GET") url += (url.find('?') == std::string::npos ? "?" : "&") + ("requestId=" + launch::RandomUuid());
    Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::seconds(1 << attempt));  // a CLI, not the daemon's loop
      auto auth = tokens_->AuthorizationHeader(Background());
      if (!auth.ok()) return auth.status();
      HttpRequest req;
      req.method = method;
      req.url = url;
      req.timeout = std::chrono::seconds(60);
      if (!auth->empty()) req.headers.emplace_back("Authorization", *auth);
      if (body) {
        req.headers.emplace_back("Content-Type", "application/json");
        req.body = body->dump();
      }
      auto r = http_->Perform(req);
      if (!r.ok()) {
        last = Status(r.status().code(), fmt::format("{}: {}", what, r.status().message()));
        continue;
      }
      auto j = Json::parse(r->body, nullptr, false);
      if (r->status == 200) return j.is_discarded() ? Json::object() : j;
      std::string message;
      if (j.is_object() && j.contains("error") && j["error"].is_object()) message = Shown(JsonString(j["error"], "message"));
      auto server = fmt::format("HTTP {}: {}", r->status, message);
      if (r->status == 429 || r->status >= 500) {
        last = UnavailableError(fmt::format("{}: {}", what, server));
        continue;
      }
      if (r->status == 401 || r->status == 403) {
        return PermissionDeniedError(fmt::format(
            "{}: permission denied ({}): the credentials need {} (e.g. roles/compute.instanceAdmin.v1) in the project, "
            "and roles/iam.serviceAccountUser on the VMs' service account",
            what, server, permission));
      }
      if (r->status == 409) {
        return FailedPreconditionError(fmt::format("{}: already exists ({}): an earlier launch of this run? pick another "
                                              "--run-id, or delete it first",
                                              what, server));
      }
      if (r->status == 404) return NotFoundError(fmt::format("{}: not found ({})", what, server));
      return InvalidArgumentError(fmt::format("{}: {}", what, server));
    }
    return last;
  }

  // Until the operation is DONE (at most 10 minutes); its error is the call's.
  Status Wait(Json op, const std::string& scope_path, const std::string& what) {
    auto until = TheClock().Now() + std::chrono::minutes(10);
    for (;;) {
      if (!op.is_object()) return OkStatus();
      if (op.contains("error") && op["error"].is_object()) {
        std::string message = "the operation failed";
        auto const& errors = op["error"]["errors"];
        if (errors.is_array() && !errors.empty() && errors[0].is_object()) {
          message = Shown(fmt::format("{}: {}", JsonString(errors[0], "code"), JsonString(errors[0], "message")));
        }
        return FailedPreconditionError(fmt::format("{}: {}", what, message));
      }
      if (JsonString(op, "status") == "DONE") return OkStatus();
      std::string name = JsonString(op, "name");
      if (name.empty()) return OkStatus();
      if (TheClock().Now() >= until) return DeadlineExceededError(what + ": not done after 10 minutes (operation " + Shown(name) + ")");
      auto next = Call("POST", fmt::format("{}/operations/{}/wait", scope_path, name), nullptr, what, "compute.*Operations.get");
      if (!next.ok()) return next.status();
      op = *std::move(next);
    }
  }

 private:
  std::string endpoint_;
  std::unique_ptr<TokenProvider> tokens_;
  std::unique_ptr<HttpClient> http_;
};

}  // namespace

int Launch(const LaunchOptions& o) {
  if (StartsWith(o.bucket, "s3://")) return LaunchEc2(o);
  if (auto flag = launch::OtherCloudFlag(o, {"--instance-types", "--subnets", "--instance-profile", "--security-groups",
                                              "--key-name", "--allocation-strategy", "--terminating-hook-timeout"},
                                         "GCE");
      !flag.empty()) {
    return UsageError(flag);
  }
  auto requests = BuildRequests(o);
  if (!requests.ok()) return UsageError(requests.status().message());
  std::string endpoint = o.compute_endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (o.dry_run) {
    for (auto const& r : *requests) {
      std::printf("%s %s%s\n%s\n\n", r.method.c_str(), endpoint.c_str(), r.path.c_str(),
                  r.body.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
    }
    std::printf("dry run: nothing was created\n");
    return 0;
  }
  auto tokens = Credentials(o);
  if (!tokens.ok()) {
    std::fprintf(stderr, "spotvisor launch: %s\n", tokens.status().message().c_str());
    return 1;
  }
  Api api(endpoint, std::move(*tokens));
  std::string project_path = "/projects/" + o.project;
  std::string group_scope = project_path + (o.zone.empty() ? "/regions/" + o.region : "/zones/" + o.zone);
  auto const& tpl = (*requests)[0];
  auto const& group = (*requests)[1];
  std::fprintf(stderr, "spotvisor launch: creating %s ...\n", tpl.what.c_str());
  auto op = api.Call(tpl.method, tpl.path, &tpl.body, tpl.what, tpl.permission);
  Status s = op.ok() ? api.Wait(*op, project_path + "/global", tpl.what) : op.status();
  if (!s.ok()) {
    std::fprintf(stderr, "spotvisor launch: %s\n", s.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "spotvisor launch: creating %s ...\n", group.what.c_str());
  op = api.Call(group.method, group.path, &group.body, group.what, group.permission);
  s = op.ok() ? api.Wait(*op, group_scope, group.what) : op.status();
  if (!s.ok()) {
    std::fprintf(stderr, "spotvisor launch: %s\n", s.message().c_str());
    // Nothing left behind: the template was made for this group only.
    auto del = api.Call("DELETE", fmt::format("{}/global/instanceTemplates/{}", project_path, o.run_id), nullptr, tpl.what,
                        "compute.instanceTemplates.delete");
    Status d = del.ok() ? api.Wait(*del, project_path + "/global", "deleting " + tpl.what) : del.status();
    if (d.ok()) {
      std::fprintf(stderr, "spotvisor launch: deleted %s again: nothing was left behind\n", tpl.what.c_str());
    } else {
      std::fprintf(stderr, "spotvisor launch: %s is left (deleting it failed: %s): gcloud compute instance-templates delete %s\n",
                   tpl.what.c_str(), d.message().c_str(), o.run_id.c_str());
    }
    return 1;
  }
  std::string where = o.zone.empty() ? "--region=" + o.region : "--zone=" + o.zone;
  std::printf(
      "launched run %s: instance template %s and %s of %d (Spot, termination action %s).\n"
      "  watch:   spotvisor runs %s\n"
      "           gcloud compute instance-groups managed list-instances %s %s --project=%s\n"
      "  stop:    spotvisor stop %s/%s\n"
      "When the run is over its VMs leave the group (size 0); then delete the group and the template:\n"
      "  gcloud compute instance-groups managed delete %s %s --project=%s --quiet && "
      "gcloud compute instance-templates delete %s --project=%s --quiet\n",
      o.run_id.c_str(), o.run_id.c_str(), group.what.c_str(), o.size, o.termination_action.c_str(), o.bucket.c_str(),
      o.run_id.c_str(), where.c_str(), o.project.c_str(), o.bucket.c_str(), o.run_id.c_str(), o.run_id.c_str(),
      where.c_str(), o.project.c_str(), o.run_id.c_str(), o.project.c_str());
  return 0;
}

}  // namespace spotvisor
