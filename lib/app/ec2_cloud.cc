// EC2: the instance metadata service over IMDSv2 (spot instance-action and
// rebalance polls), CloudWatch Logs, the EC2 API for on-exit stop | delete
// and the spotvisor-phase tag, all with the instance role's credentials.
#include <fmt/format.h>

#include "app/cloud.h"
#include "common/strings.h"
#include "compute/ec2_client.h"
#include "http/http_client.h"
#include "log/cloudwatch_logs_sink.h"
#include "metadata/ec2_notices.h"
#include "metadata/guest_attributes.h"
#include "metadata/imds_client.h"
#include "storage/aws_credentials.h"

namespace spotvisor {
namespace {

// The instance role (or the environment's keys); a malformed key in the
// environment becomes a provider whose every Get says why.
std::unique_ptr<AwsCredentialProvider> Credentials(const Clock& clock) {
  auto creds = DefaultAwsCredentials(clock);
  if (creds.ok()) return std::move(*creds);
  return std::make_unique<FailingAwsCredentials>(creds.status());
}

class Ec2NoticeWatch final : public NoticeWatch {
 public:
  explicit Ec2NoticeWatch(std::unique_ptr<Ec2NoticeWatcher> w) : w_(std::move(w)) {}
  void Start() override { w_->Start(); }
  void Stop() override { w_->Stop(); }

 private:
  std::unique_ptr<Ec2NoticeWatcher> w_;
};

class Ec2Cloud final : public Cloud {
 public:
  Ec2Cloud(MetadataSnapshot m, const Clock& clock) : m_(std::move(m)), clock_(clock) {}

  std::string Name() const override { return "aws"; }

  void Announce(Logger& logger) const override {
    logger.Info("cloud.detected",
                fmt::format("on EC2: instance {} in {} (the instance metadata service answered at {})", m_.instance_id,
                            m_.zone.empty() ? "?" : m_.zone, ImdsEndpointFromEnv()),
                {{"cloud", "aws"}, {"instance", m_.instance_name}, {"zone", m_.zone}});
    if (m_.ec2_tags_hidden) {
      logger.Info("config.tags_hidden",
                  "instance tags are not exposed in the instance metadata, so spotvisor-KEY tags cannot configure this "
                  "run; to use them: aws ec2 modify-instance-metadata-options --instance-id " + m_.instance_id +
                      " --instance-metadata-tags enabled");
    }
  }

  StatusOr<std::unique_ptr<LogSink>> MakeLogSink(const ConfigResult& r, std::string& description,
                                                 nlohmann::json& fields) override {
    if (m_.region.empty()) {
      return FailedPreconditionError("log-to: api on EC2 needs the region, and the instance metadata did not say it");
    }
    CloudWatchLogsOptions co;
    co.region = m_.region;
    co.endpoint = CloudWatchLogsEndpoint(co.region);
    co.instance_id = m_.instance_id;
    // An invalid log-group is a config error of its own; the default then,
    // so that the error still reaches CloudWatch.
    co.log_group = r.config ? r.config->log_group : std::string(Trim(r.values.at("log-group").value));
    if (!ValidLogGroupName(co.log_group)) co.log_group = "spotvisor";
    if (r.config) co.labels = r.config->log_labels;
    auto sink = std::make_unique<CloudWatchLogsSink>(co, Credentials(clock_), MakeCurlHttpClient(), clock_);
    description = fmt::format("logging to CloudWatch Logs ({}) in log group {}, streams {} and {}", co.endpoint,
                              co.log_group, sink->StreamName(false), sink->StreamName(true));
    fields = {{"service", "cloudwatch-logs"}, {"log_group", co.log_group}};
    return std::unique_ptr<LogSink>(std::move(sink));
  }

  void AddInstanceControl(const Config& /*config*/, SupervisorOptions& so, Sleeper& /*retry_sleeper*/,
                          Logger& logger) override {
    if (m_.region.empty()) return;  // no EC2 API endpoint to call: on-exit powers off
    Ec2InstanceRef ref{m_.instance_id, m_.region};
    const Clock& clock = clock_;
    so.make_compute = [ref, &clock](Sleeper& s) -> std::unique_ptr<ComputeClient> {
      return MakeEc2ComputeClient("", ref, Credentials(clock), s, clock);
    };
    so.compute_api = "the EC2 API";
    // The phase as an instance tag: said once if the role may not tag.
    auto tag_cancel = std::make_shared<CancelSource>();
    // Its own sleeper: the writer's cancel at exit must also cut a retry's
    // backoff short (after a late EC2 notice it held spotvisor 1.3 s past
    // the writer's deadline).
    auto tag_sleeper = std::make_shared<CancellableSleeper>();
    std::shared_ptr<Ec2Tagger> tagger = MakeEc2Tagger("", ref, Credentials(clock), *tag_sleeper, clock);
    so.instance_tags = std::make_shared<GuestAttributesWriter>(
        [tagger, tag_sleeper, tag_cancel, &clock](const std::string& key, const std::string& value) {
          CallContext ctx;
          ctx.cancel = tag_cancel;
          ctx.clock = &clock;
          ctx.deadline = clock.Now() + std::chrono::seconds(20);
          return tagger->SetTag("spotvisor-" + key, value, ctx);
        },
        [tag_cancel, tag_sleeper] {
          tag_cancel->Cancel();
          tag_sleeper->Cancel();
        },
        [&logger](const Status& s) {
          logger.Warn("instance_tags.failed",
                      "cannot set the instance tag spotvisor-phase (the phase stays in the logs and status.json): " +
                          s.message());
        });
  }

  std::unique_ptr<GroupClient> MakeGroupClient(const InstanceGroup& group, const std::string& /*compute_endpoint*/,
                                               Sleeper& sleeper) override {
    if (m_.region.empty()) return nullptr;
    return MakeAsgClient("", group, Ec2InstanceRef{m_.instance_id, m_.region}, Credentials(clock_), sleeper, clock_);
  }

  std::unique_ptr<NoticeWatch> WatchNotices(const Config& /*config*/, Supervisor& supervisor, Logger& logger,
                                            const std::optional<InstanceGroup>& group) override {
    Ec2NoticeCallbacks cb;
    cb.on_interruption = [&supervisor](const Ec2InterruptionNotice& n, const std::string& body) {
      supervisor.NotifyPreempted(n.time, fmt::format("EC2 Spot interruption notice ({}: {})", n.action, body));
    };
    cb.on_rebalance = [&supervisor](const std::string& body) { supervisor.NotifyRebalance(body); };
    if (group && group->kind == InstanceGroup::Kind::kAsg) {
      cb.on_terminating = [&supervisor](const std::string& state) { supervisor.NotifyGroupTerminating(state); };
    }
    cb.on_failing = [&logger](const Status& s) {
      logger.Warn("metadata.unavailable",
                  fmt::format("polling spot/instance-action: {}; still polling every second", s.message()),
                  {{"path", "spot/instance-action"}, {"error", s.message()}});
    };
    cb.on_recovered = [&logger](int n) {
      logger.Info("metadata.recovered", fmt::format("polling spot/instance-action again after {} failed poll(s)", n),
                  {{"path", "spot/instance-action"}, {"failed_attempts", n}});
    };
    return std::make_unique<Ec2NoticeWatch>(std::make_unique<Ec2NoticeWatcher>(
        MakeImdsClient(ImdsOptions{}, clock_), clock_, std::chrono::seconds(1), std::move(cb)));
  }

 private:
  MetadataSnapshot m_;
  const Clock& clock_;
};

}  // namespace

std::unique_ptr<Cloud> MakeEc2Cloud(const MetadataSnapshot& metadata, const Clock& clock) {
  return std::make_unique<Ec2Cloud>(metadata, clock);
}

}  // namespace spotvisor
