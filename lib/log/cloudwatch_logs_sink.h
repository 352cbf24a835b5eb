// Writes log events to Amazon CloudWatch Logs directly (PutLogEvents, the
// AWS JSON 1.1 protocol, SigV4 with the instance role's or the
// environment's credentials), the EC2 counterpart of CloudLoggingSink.
//
// Two log streams per instance in the log group `log-group`:
// INSTANCE_ID/spotvisor (spotvisor's events, one JSON object each: what
// CloudWatch Logs Insights reads as fields) and INSTANCE_ID/spotvisor-trainer
// (the trainer's lines as it printed them). The group and the streams are
// created when first needed (logs:CreateLogGroup, logs:CreateLogStream; an
// existing one is fine). Batches follow the API's rules: one stream per
// request, events in chronological order, at most 10,000 events and
// 1,048,576 bytes (each event's UTF-8 message plus 26), each event at most
// 256 KiB (a longer one is cut into parts on UTF-8 boundaries). Sequence
// tokens are not used (AWS ignores them since 2023). Throttling and 5xx are
// retried with backoff within a budget; an expired session token is fetched
// again once. CloudWatch Logs has no idempotency key: a batch whose answer
// was lost is sent again and may appear twice.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/cancel.h"
#include "common/clock.h"
#include "http/http_client.h"
#include "log/batching_sink.h"
#include "retry/sleeper.h"
#include "storage/aws_credentials.h"

namespace spotvisor {

struct CloudWatchLogsOptions {
  std::string endpoint;  // "https://logs.REGION.amazonaws.com" or an override
  std::string region;
  std::string log_group = "spotvisor";
  std::string instance_id;                  // the streams are INSTANCE_ID/spotvisor and INSTANCE_ID/spotvisor-trainer
  std::map<std::string, std::string> labels;  // log-labels, in every JSON event
  std::size_t max_queued = 10'000;
  std::size_t batch_entries = 1'000;        // the API takes up to 10,000
  std::size_t batch_bytes = 1'048'576;      // the API's limit, counted as it counts
  std::size_t max_event_bytes = 262'144;    // message + 26, the API's long-standing per-event limit
  std::chrono::milliseconds batch_delay{1000};
  std::chrono::milliseconds retry_budget{30'000};  // per batch, then it is dropped and counted
};

class CloudWatchLogsSink final : public BatchingSink {
 public:
  CloudWatchLogsSink(CloudWatchLogsOptions options, std::unique_ptr<AwsCredentialProvider> credentials,
                     std::unique_ptr<HttpClient> http, const Clock& clock);
  ~CloudWatchLogsSink() override;

  std::string StreamName(bool trainer) const;
  // The messages for one event (exposed for tests): the trainer's line as
  // printed, or spotvisor's event as one JSON object (severity, message,
  // event, time, labels, fields); cut into parts when above the limit.
  std::vector<std::string> MakeMessages(const LogEvent& e, WallTime time,
                                        const std::map<std::string, std::string>& labels) const;

 private:
  void Encode(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels,
              std::vector<Entry>& out) override;
  SendResult Send(std::vector<Entry>& batch) override;
  void Interrupt() override;
  // One request: PutLogEvents, CreateLogStream, CreateLogGroup. The answer's
  // __type is returned in `type`.
  StatusOr<HttpResponse> Call(const std::string& target, const std::string& body, std::string& type,
                              bool& token_retried);
  Status EnsureStream(int channel, std::string& problem);

  CloudWatchLogsOptions o_;
  std::unique_ptr<AwsCredentialProvider> creds_;
  std::unique_ptr<HttpClient> http_;
  const Clock& clock_;
  CancellableSleeper sleeper_;
  std::shared_ptr<CancelSource> cancel_ = std::make_shared<CancelSource>();
  bool stream_ready_[2] = {false, false};  // the sink's thread only
};

// The endpoint for CloudWatch Logs in `region`: AWS_ENDPOINT_URL_CLOUDWATCH_LOGS,
// then AWS_ENDPOINT_URL (the AWS SDKs' overrides), then logs.REGION.amazonaws.com.
std::string CloudWatchLogsEndpoint(const std::string& region);

}  // namespace spotvisor
