// GCE: the metadata server (instance/preempted, maintenance-event and
// upcoming-maintenance long-polls, guest attributes), the Cloud Logging
// API, the Compute Engine API for on-exit stop | delete.
#include <cstdlib>

#include <fmt/format.h>

#include "app/cloud.h"
#include "common/strings.h"
#include "compute/compute_client.h"
#include "http/http_client.h"
#include "log/cloud_logging_sink.h"
#include "metadata/guest_attributes.h"
#include "metadata/upcoming_maintenance.h"
#include "metadata/watcher.h"
#include "retry/backoff_policy.h"
#include "storage/token_provider.h"

namespace spotvisor {

bool MetadataRequired(Mode mode) {
  const char* host = std::getenv("GCE_METADATA_HOST");
  return mode == Mode::kDaemon || (host != nullptr && *host != '\0');
}

std::unique_ptr<MetadataClient> NewMetadataClient(Mode mode) {
  auto endpoint = MetadataEndpointFromEnv();
  // Off GCE, 169.254.169.254 usually swallows packets: do not hang there.
  if (!MetadataRequired(mode)) endpoint.connect_timeout = std::chrono::milliseconds(1000);
  return MakeMetadataClient(endpoint, MakeCurlHttpClient(), MakeCurlHttpClient);
}

namespace {

class GceNoticeWatch final : public NoticeWatch {
 public:
  std::vector<std::unique_ptr<MetadataWatcher>> watchers;
  void Start() override {
    for (auto& w : watchers) w->Start();
  }
  void Stop() override {
    for (auto& w : watchers) w->Stop();
  }
};

class GceCloud final : public Cloud {
 public:
  GceCloud(MetadataSnapshot m, Mode mode, const Clock& clock) : m_(std::move(m)), mode_(mode), clock_(clock) {}

  std::string Name() const override { return "gce"; }

  void Announce(Logger& logger) const override {
    logger.Info("cloud.detected", fmt::format("on GCE: instance {} in {}", m_.instance_name, m_.zone),
                {{"cloud", "gce"}, {"instance", m_.instance_name}, {"zone", m_.zone}});
  }

  StatusOr<std::unique_ptr<LogSink>> MakeLogSink(const ConfigResult& r, std::string& description,
                                                 nlohmann::json& /*fields*/) override {
    CloudLoggingOptions lo;
    lo.endpoint = r.config ? r.config->logging_endpoint : std::string(Trim(r.values.at("logging-endpoint").value));
    while (!lo.endpoint.empty() && lo.endpoint.back() == '/') lo.endpoint.pop_back();
    lo.project_id = m_.project_id;
    lo.instance_id = m_.instance_id;
    lo.zone = m_.zone;
    if (r.config) lo.labels = r.config->log_labels;
    description = fmt::format("logging to Cloud Logging ({}) as projects/{}/logs/spotvisor and spotvisor-trainer",
                              lo.endpoint, m_.project_id);
    return std::unique_ptr<LogSink>(std::make_unique<CloudLoggingSink>(
        lo, std::make_unique<MetadataTokenProvider>(NewMetadataClient(mode_), clock_), MakeCurlHttpClient()));
  }

  void AddInstanceControl(const Config& config, SupervisorOptions& so, Sleeper& /*retry_sleeper*/,
                          Logger& logger) override {
    so.guest_attributes = std::make_shared<GuestAttributesWriter>(NewMetadataClient(mode_), [&logger](const Status& s) {
      logger.Warn("guest_attributes.failed",
                  "cannot write guest attributes (status stays in the logs and status.json): " + s.message());
    });
    InstanceRef ref{m_.project_id, m_.zone, m_.instance_name};
    auto endpoint = config.compute_endpoint;
    auto mode = mode_;
    const Clock& clock = clock_;
    so.make_compute = [ref, endpoint, mode, &clock](Sleeper& retry_sleeper) {
      return MakeComputeClient(endpoint, ref, std::make_unique<MetadataTokenProvider>(NewMetadataClient(mode), clock),
                               retry_sleeper);
    };
  }

  std::unique_ptr<GroupClient> MakeGroupClient(const InstanceGroup& group, const std::string& compute_endpoint,
                                               Sleeper& sleeper) override {
    return MakeMigClient(compute_endpoint, group, InstanceRef{m_.project_id, m_.zone, m_.instance_name},
                         std::make_unique<MetadataTokenProvider>(NewMetadataClient(mode_), clock_), sleeper);
  }

  std::unique_ptr<NoticeWatch> WatchNotices(const Config& config, Supervisor& supervisor, Logger& logger,
                                            const std::optional<InstanceGroup>& /*group*/) override {
    auto out = std::make_unique<GceNoticeWatch>();
    auto watch = [&](const char* path, MetadataValue initial, std::function<void(const std::string&)> on_change,
                     std::function<bool(const Status&)> absent = nullptr) {
      WatcherOptions wo;
      wo.absent = std::move(absent);
      wo.timeout_sec = std::chrono::duration_cast<std::chrono::seconds>(config.metadata_watch_timeout);
      wo.backoff = std::make_unique<ExponentialBackoffPolicy>(std::chrono::milliseconds(100), std::chrono::seconds(2), 2.0);
      WatcherCallbacks cb;
      cb.on_change = std::move(on_change);
      std::string p = path;
      cb.on_failing = [&logger, p](const Status& s) {
        logger.Warn("metadata.unavailable", fmt::format("watching {}: {}; retrying with backoff", p, s.message()),
                    {{"path", p}, {"error", s.message()}});
      };
      cb.on_recovered = [&logger, p](int n) {
        logger.Info("metadata.recovered", fmt::format("watching {} again after {} failed attempt(s)", p, n),
                    {{"path", p}, {"failed_attempts", n}});
      };
      out->watchers.push_back(std::make_unique<MetadataWatcher>(NewMetadataClient(mode_), path, std::move(initial),
                                                                std::move(wo), std::move(cb)));
    };
    watch("instance/preempted", m_.preempted, [&supervisor](const std::string& v) {
      if (v == "TRUE") supervisor.NotifyPreempted();
    });
    watch("instance/maintenance-event", m_.maintenance,
          [&supervisor](const std::string& v) { supervisor.NotifyMaintenance(v); });
    // The window of maintenance ahead (issue #14). ETag "0" cannot match, so
    // the first request answers at once with what is scheduled now; 404 and
    // 503 "no notifications" mean nothing is (asked again every 30 s).
    watch("instance/upcoming-maintenance?alt=json", MetadataValue{"", "0"},
          [&supervisor](const std::string& v) { supervisor.NotifyUpcomingMaintenance(v); }, IsNoMaintenanceAnswer);
    return out;
  }

 private:
  MetadataSnapshot m_;
  Mode mode_;
  const Clock& clock_;
};

}  // namespace

std::unique_ptr<Cloud> MakeGceCloud(const MetadataSnapshot& metadata, Mode mode, const Clock& clock) {
  return std::make_unique<GceCloud>(metadata, mode, clock);
}

std::unique_ptr<Cloud> MakeCloud(const MetadataSnapshot& metadata, Mode mode, const Clock& clock) {
  if (!metadata.available) return nullptr;
  if (metadata.cloud == "aws") return MakeEc2Cloud(metadata, clock);
  if (metadata.cloud == "gce") return MakeGceCloud(metadata, mode, clock);
  return nullptr;
}

}  // namespace spotvisor
