// Where checkpoints are kept: a Cloud Storage bucket through the JSON API,
// an S3 bucket through its REST API, or a local directory (file:// for
// local use and the demo). The sync engine
// only sees this interface.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cancel.h"
#include "common/status.h"

namespace spotvisor {

struct ObjectInfo {
  std::string name;  // relative to the store's root (bucket prefix)
  std::int64_t generation = 0;
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};

// What a person listing the bucket should see about an object (`gcloud
// storage ls -L`): its content type and custom metadata. Stores that cannot
// hold it ignore it.
struct ObjectDescription {
  std::string content_type;                    // empty: the store's default
  std::map<std::string, std::string> metadata; // custom metadata
};

struct Precondition {
  // Write or delete only if the live object has this generation; 0 means
  // "only if there is no such object". Failure is kFailedPrecondition.
  std::optional<std::int64_t> if_generation_match;
};

// Every call takes the operation's CallContext: each request and each retry
// wait honours its deadline and cancellation (kDeadlineExceeded, kCancelled).
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Uploads a local file. The crc32c computed while reading is sent along,
  // so the server rejects corrupted bytes, and is returned in ObjectInfo.
  virtual StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path,
                                          const Precondition& pre, const CallContext& ctx) = 0;
  virtual StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data,
                                           const Precondition& pre, const CallContext& ctx) = 0;
  // kNotFound when there is no such object.
  virtual StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) = 0;
  // Streams to `path` (which must not exist yet) and verifies the crc32c.
  // `size_hint`: the size the caller expects (0: unknown); a store may fetch
  // a large object in parallel ranges when it knows it.
  virtual StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path,
                                              std::uint64_t size_hint, const CallContext& ctx) = 0;
  virtual StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) = 0;
  // Deleting an object that is already gone is not an error.
  virtual Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) = 0;
  // Can we list (and so probably use) the store? Run before training, so a
  // missing bucket or a missing permission is found before hours of work.
  virtual Status CheckAccess(const CallContext& ctx) = 0;
  // "gs://bucket/prefix", "s3://bucket/prefix" or "file:///dir", for messages.
  virtual std::string Describe() const = 0;
};

// bucket = "gs://BUCKET[/PREFIX]", "s3://BUCKET[/PREFIX]" or "file:///PATH".
struct StoreLocation {
  std::string scheme;  // "gs", "s3" or "file"
  std::string bucket;  // gs and s3 only
  std::string prefix;  // gs, s3: object name prefix, no leading/trailing '/'; file: the directory
};
StatusOr<StoreLocation> ParseStoreLocation(const std::string& url);

}  // namespace spotvisor
