// Amazon S3 (and S3-compatible stores) through its REST API over libcurl,
// requests signed with SigV4: PutObject with x-amz-checksum-crc32c for
// small files, multipart uploads (parts in parallel, each with its crc32c,
// the whole checked by S3 as a FULL_OBJECT crc32c at
// CompleteMultipartUpload; aborted on failure) for large ones,
// ListObjectsV2 with continuation, ranged GetObject in parallel for large
// downloads, conditional writes (If-None-Match: *, If-Match: ETAG) for the
// manifest commit, the same as ifGenerationMatch on Cloud Storage.
//
// S3 has no generation numbers; ObjectInfo::generation is a 63-bit hash of
// the object's ETag (never 0), and a precondition on it becomes If-Match
// with that ETag (learned from the write, the listing, or a HEAD).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "http/http_client.h"
#include "retry/backoff_policy.h"
#include "retry/retry_policy.h"
#include "retry/sleeper.h"
#include "storage/aws_credentials.h"
#include "storage/object_store.h"

namespace spotvisor {

struct S3Options {
  // Empty: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then AWS's own
  // (https://BUCKET.s3.REGION.amazonaws.com). A configured endpoint is
  // addressed path-style (ENDPOINT/BUCKET/KEY), as S3-compatible stores want.
  std::string endpoint;
  // Empty: AWS_REGION, then AWS_DEFAULT_REGION, then us-east-1. A bucket in
  // another region is found from S3's answer (x-amz-bucket-region) and the
  // request signed again for it.
  std::string region;
  std::string bucket;
  std::string prefix;  // object keys are PREFIX/NAME
  // Files up to this size go up in one PutObject; larger ones as a
  // multipart upload of parts of at least part_min_bytes (S3: >= 5 MiB but
  // the last, <= 10,000 parts).
  std::size_t single_max_bytes = 8u << 20;
  std::size_t part_min_bytes = 8u << 20;
  // Downloads of at least this size come down as parallel byte ranges.
  std::size_t parallel_min_bytes = 64u << 20;
  int streams = 4;
  int urgent_streams = 8;
  std::function<std::unique_ptr<HttpClient>()> make_http = MakeCurlHttpClient;
  std::function<std::unique_ptr<RetryPolicy>()> make_retry;
  std::function<std::unique_ptr<BackoffPolicy>()> make_backoff;
  Sleeper* sleeper = nullptr;
  std::function<ObjectDescription(const std::string& name)> describe;
  const Clock* clock = nullptr;  // for signing; null: the system clock
};

// The endpoint and whether it is AWS's own (virtual-hosted addressing).
std::string S3EndpointFromEnv();
std::string S3RegionFromEnv();

std::unique_ptr<ObjectStore> MakeS3ObjectStore(S3Options options, std::unique_ptr<AwsCredentialProvider> credentials);

}  // namespace spotvisor
