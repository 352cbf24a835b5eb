// Cloud Storage through its JSON API over libcurl: multipart upload (with
// the crc32c in the metadata) for small files, resumable upload in chunks
// that are multiples of 256 KiB for large ones (308 handling, resuming after
// a dropped connection by querying the session), parallel composite uploads
// (parts in parallel, then `compose`) and parallel ranged downloads for the
// largest, list with paging, alt=media downloads streamed to disk and
// checked against their crc32c, delete, ifGenerationMatch preconditions.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "http/http_client.h"
#include "retry/backoff_policy.h"
#include "retry/retry_policy.h"
#include "retry/sleeper.h"
#include "storage/object_store.h"
#include "storage/token_provider.h"

namespace spotvisor {

struct GcsOptions {
  std::string endpoint = "https://storage.googleapis.com";  // requests append /storage/v1/...
  std::string bucket;
  std::string prefix;  // object names are PREFIX/NAME
  std::size_t multipart_max_bytes = 8u << 20;  // larger files use a resumable upload
  std::size_t chunk_bytes = 16u << 20;         // multiple of 256 KiB
  // Files of at least this size go up as parts in parallel, composed into
  // one object (a parallel composite upload), and come down as byte ranges
  // in parallel; 0: never. Parts are at least part_min_bytes, at most 32 of
  // them (what one compose takes).
  std::size_t parallel_min_bytes = 64u << 20;
  std::size_t part_min_bytes = 16u << 20;
  // Transfers at once in the whole store (whole files, parts, ranges);
  // an urgent context (the final sync inside a Spot window) may use up to
  // urgent_streams.
  int streams = 4;
  int urgent_streams = 8;
  std::function<std::unique_ptr<HttpClient>()> make_http = MakeCurlHttpClient;
  // Retry: which errors and for how long; jittered exponential delays;
  // waits go through `sleeper` (cancelled at shutdown). Google's guidance:
  // retry 408, 429, 5xx, resets and timeouts, only for idempotent requests.
  std::function<std::unique_ptr<RetryPolicy>()> make_retry;
  std::function<std::unique_ptr<BackoffPolicy>()> make_backoff;
  Sleeper* sleeper = nullptr;
  // Content type and custom metadata for each object written, by its name
  // (relative to the prefix); null: none.
  std::function<ObjectDescription(const std::string& name)> describe;
};

// The endpoint to use: STORAGE_EMULATOR_HOST (with or without a scheme)
// wins over `configured`, and turns authentication off, as in Google's
// client libraries. `auth` is set to false in that case.
std::string StorageEndpoint(const std::string& configured, bool& auth);

std::unique_ptr<ObjectStore> MakeGcsObjectStore(GcsOptions options, std::unique_ptr<TokenProvider> tokens);


}  // namespace spotvisor
