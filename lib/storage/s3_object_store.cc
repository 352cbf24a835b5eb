#include "storage/s3_object_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "common/buffer_pool.h"
#include "common/parallel_for.h"
#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "storage/crc32c.h"
#include "storage/s3_xml.h"
#include "storage/transfer.h"

namespace spotvisor {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Header values from outside (a trainer's path in metadata): printable
// ASCII only, the rest percent-encoded.
std::string HeaderSafe(std::string_view v) {
  std::string out;
  for (unsigned char c : v) {
    if (c >= 0x20 && c < 0x7f && c != '%') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

class S3ObjectStore final : public ObjectStore {
 public:
  S3ObjectStore(S3Options o, std::unique_ptr<AwsCredentialProvider> creds)
      : o_(std::move(o)), creds_(std::move(creds)), slots_(o_.streams, o_.urgent_streams), http_(o_.make_http) {
    if (!o_.clock) o_.clock = &system_clock_;
    retry_ = StoreRetry{o_.make_retry, o_.make_backoff, o_.sleeper};
    retry_.Defaults(&default_sleeper_);
    if (o_.region.empty()) o_.region = S3RegionFromEnv();
    if (o_.endpoint.empty()) o_.endpoint = S3EndpointFromEnv();
    aws_endpoint_ = o_.endpoint.empty();
    while (!o_.endpoint.empty() && o_.endpoint.back() == '/') o_.endpoint.pop_back();
    region_ = o_.region;
    o_.part_min_bytes = std::max<std::size_t>(o_.part_min_bytes, 5u << 20);
  }

  std::string Describe() const override { return BucketUrl(); }

  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override {
    return Retry(ctx, [&] { return Put(name, data, Crc32c(data), pre, /*sign_payload=*/true, ctx); });
  }

  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "uploading " + path);
    auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > o_.single_max_bytes) return MultipartUpload(name, path, size, pre, ctx);
    Slot slot(slots_, ctx);
    if (!slot.status().ok()) return slot.status();
    auto r = Retry(ctx, [&]() -> StatusOr<ObjectInfo> {
      Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
      if (f.fd < 0) return ErrnoToStatus(errno, "opening " + path);
      std::string data;
      // One byte more than expected shows a file that grew.
      if (auto s = ReadAt(f.fd, 0, static_cast<std::size_t>(size) + 1, data); !s.ok()) {
        return Status(s.code(), s.message() + " " + path);
      }
      if (data.size() != size) return FailedPreconditionError(path + " changed size while being read");
      return Put(name, data, Crc32c(data), pre, /*sign_payload=*/false, ctx);
    });
    if (r.ok()) ctx.Moved(static_cast<std::int64_t>(size));
    return r;
  }

  StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) override {
    return Retry(ctx, [&]() -> StatusOr<std::string> {
      auto r = Call("GET", Key(name), "", {{"x-amz-checksum-mode", "ENABLED"}}, "", ctx);
      if (!r.ok()) return r.status();
      if (r->status != 200) return Error(*r, "reading " + Url(name), "s3:GetObject");
      std::uint32_t crc = Crc32c(r->body);
      if (auto s = CheckCrc(*r, crc, name); !s.ok()) return s;
      if (info) *info = ObjectInfo{name, Learn(r->Header("etag")), r->body.size(), crc};
      return std::move(r->body);
    });
  }

  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, std::uint64_t size_hint,
                                      const CallContext& ctx) override {
    if (o_.parallel_min_bytes > 0 && size_hint >= o_.parallel_min_bytes && size_hint > o_.part_min_bytes) {
      return RangedDownload(name, path, size_hint, ctx);
    }
    Slot slot(slots_, ctx);
    if (!slot.status().ok()) return slot.status();
    std::uint64_t counted = 0;
    return Retry(ctx, [&]() -> StatusOr<ObjectInfo> {
      ctx.Moved(-static_cast<std::int64_t>(counted));
      counted = 0;
      Fd f{open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
      if (f.fd < 0) return ErrnoToStatus(errno, "creating " + path);
      FileWriter w(f.fd, path, size_hint, ctx, counted);
      auto on_body = [&w](std::string_view chunk) { return w.Feed(chunk); };
      auto r = Call("GET", Key(name), "", {{"x-amz-checksum-mode", "ENABLED"}}, "", ctx, on_body);
      if (!w.error.ok()) return w.error;
      if (!r.ok()) return r.status();
      if (r->status != 200) return Error(*r, "downloading " + Url(name), "s3:GetObject");
      if (auto s = w.Finish(); !s.ok()) return s;
      if (auto s = CheckCrc(*r, w.crc, name); !s.ok()) return s;
      if (fsync(f.fd) != 0) return ErrnoToStatus(errno, "flushing " + path);
      return ObjectInfo{name, Learn(r->Header("etag")), w.size, w.crc};
    });
  }

  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) override {
    std::vector<ObjectInfo> out;
    std::string token;
    do {
      auto page = Retry(ctx, [&]() -> StatusOr<S3ListPage> {
        std::string q = "encoding-type=url&list-type=2&prefix=" + AwsUriEncode(FullName(prefix), false);
        if (!token.empty()) q += "&continuation-token=" + AwsUriEncode(token, false);
        auto r = Call("GET", "", q, {}, "", ctx);
        if (!r.ok()) return r.status();
        if (r->status != 200) return Error(*r, "listing " + BucketUrl(), "s3:ListBucket");
        return ParseListObjectsV2(r->body);
      });
      if (!page.ok()) return page.status();
      for (auto const& item : page->items) {
        if (!o_.prefix.empty() && item.key.rfind(o_.prefix + "/", 0) != 0) continue;
        std::string rel = o_.prefix.empty() ? item.key : item.key.substr(o_.prefix.size() + 1);
        out.push_back(ObjectInfo{rel, Learn(item.etag), item.size, 0});
      }
      token = page->next_token;
    } while (!token.empty());
    return out;
  }

  // A one-key list (s3:ListBucket), then multipart uploads under the prefix
  // that a crash left behind more than a day ago are aborted: their parts
  // are billed until then. A bucket lifecycle rule
  // (AbortIncompleteMultipartUpload) does the same for runs that never
  // start again.
  Status CheckAccess(const CallContext& ctx) override {
    auto s = Retry(ctx, [&]() -> Status {
      auto r = Call("GET", "", "list-type=2&max-keys=1&prefix=" + AwsUriEncode(FullName(""), false), {}, "", ctx);
      if (!r.ok()) return r.status();
      if (r->status == 200) return OkStatus();
      return Error(*r, "listing " + BucketUrl(), "s3:ListBucket");
    });
    if (!s.ok()) return s;
    AbortLeftovers(ctx);
    return OkStatus();
  }

  Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) override {
    return Retry(ctx, [&]() -> Status {
      std::vector<std::pair<std::string, std::string>> headers;
      if (pre.if_generation_match && *pre.if_generation_match != 0) {
        auto etag = EtagFor(name, *pre.if_generation_match, ctx);
        if (!etag.ok()) return etag.status().code() == StatusCode::kNotFound ? OkStatus() : etag.status();
        headers.emplace_back("If-Match", "\"" + *etag + "\"");
      }
      auto r = Call("DELETE", Key(name), "", headers, "", ctx);
      if (!r.ok()) return r.status();
      // A repeated delete meets 204 (or 404 with If-Match): done either way.
      if (r->status == 204 || r->status == 200 || r->status == 404) return OkStatus();
      return Error(*r, "deleting " + Url(name), "s3:DeleteObject");
    });
  }

 private:
  // Every write spotvisor makes is safe to repeat (see GcsObjectStore): the
  // manifest under a precondition, checkpoint objects under fresh names.
  template <typename Fn>
  auto Retry(const CallContext& ctx, Fn&& fn) -> decltype(fn()) {
    return retry_.Run(ctx, Idempotency::kIdempotent, std::forward<Fn>(fn));
  }

  std::string FullName(const std::string& name) const { return o_.prefix.empty() ? name : o_.prefix + "/" + name; }
  std::string BucketUrl() const { return o_.prefix.empty() ? "s3://" + o_.bucket : fmt::format("s3://{}/{}", o_.bucket, o_.prefix); }
  std::string Url(const std::string& name) const { return fmt::format("s3://{}/{}", o_.bucket, FullName(name)); }
  // The request path for an object, encoded (keys keep their '/').
  std::string Key(const std::string& name) const { return AwsUriEncode(FullName(name), true); }

  // The URL for `key` (encoded) in the bucket: virtual-hosted on AWS's own
  // endpoint when the bucket name allows it, path-style otherwise.
  std::string UrlFor(const std::string& key, const std::string& query) {
    std::string base;
    if (aws_endpoint_) {
      std::lock_guard lk(mu_);
      if (o_.bucket.find('.') == std::string::npos) {
        base = fmt::format("https://{}.s3.{}.amazonaws.com/{}", o_.bucket, region_, key);
      } else {
        base = fmt::format("https://s3.{}.amazonaws.com/{}/{}", region_, o_.bucket, key);
      }
    } else {
      base = fmt::format("{}/{}/{}", o_.endpoint, AwsUriEncode(o_.bucket, false), key);
    }
    return query.empty() ? base : base + "?" + query;
  }

  // One signed request. Re-signed and sent again (once each) when S3 says
  // the bucket is in another region, or that the session token expired.
  StatusOr<HttpResponse> Call(const std::string& method, const std::string& key, const std::string& query,
                              std::vector<std::pair<std::string, std::string>> headers, std::string_view body,
                              const CallContext& ctx, std::function<bool(std::string_view)> on_body = {},
                              bool sign_payload = true) {
    bool region_retried = false, token_retried = false;
    HttpRequest req;
    // Borrowed: Call returns before the caller's bytes go (a part's 8 MiB
    // are not copied again).
    req.borrowed_body = body.data() != nullptr ? body : std::string_view("", 0);
    std::string payload_hash = sign_payload ? Sha256Hex(body) : std::string(kUnsignedPayload);
    for (;;) {
      auto creds = creds_->Get(ctx);
      if (!creds.ok()) return creds.status();
      std::string region;
      {
        std::lock_guard lk(mu_);
        region = region_;
      }
      req.method = method;
      req.url = UrlFor(key, query);
      req.headers = headers;
      req.timeout = on_body ? std::chrono::hours(24) : std::chrono::minutes(5);
      req.low_speed_limit = on_body ? 1024 : 0;
      req.on_body = on_body;
      if (auto s = SignV4(req, *creds, region, "s3", payload_hash, o_.clock->WallNow()); !s.ok()) return s;
      auto r = http_.Send(req, ctx);
      if (!r.ok()) return r.status();
      if (r->status == 301 || r->status == 307 || r->status == 400) {
        std::string where = r->Header("x-amz-bucket-region");
        if (where.empty()) where = XmlText(r->body, "Region").value_or("");
        if (!where.empty() && where != region && !region_retried && where.size() < 64 &&
            where.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos) {
          std::lock_guard lk(mu_);
          region_ = where;  // the bucket's region, from now on
          region_retried = true;
          continue;
        }
      }
      if (r->status == 400 || r->status == 403) {
        auto code = XmlText(r->body, "Code").value_or("");
        if ((code == "ExpiredToken" || code == "TokenRefreshRequired") && !token_retried) {
          creds_->Invalidate();
          token_retried = true;
          continue;
        }
      }
      return r;
    }
  }

  // S3's answer → a Status naming what to fix. `action`: the IAM action the
  // request needs, for AccessDenied.
  Status Error(const HttpResponse& r, const std::string& what, const std::string& action) {
    std::string code = output::EscapeInvalidUtf8(XmlText(r.body, "Code").value_or("").substr(0, 100));
    std::string message = output::EscapeInvalidUtf8(XmlText(r.body, "Message").value_or("").substr(0, 300));
    std::string server = code.empty() ? fmt::format("HTTP {}", r.status) : fmt::format("HTTP {} {}: {}", r.status, code, message);
    if (code == "SlowDown" || r.status == 503) {
      return UnavailableError(fmt::format("{}: S3 asks to slow down ({}); retried with backoff", what, server));
    }
    if (r.status >= 500 || code == "RequestTimeout" || code == "ExpiredToken" || code == "ConditionalRequestConflict") {
      return UnavailableError(fmt::format("{}: {}", what, server));
    }
    if (r.status == 412 || code == "PreconditionFailed") {
      return FailedPreconditionError(fmt::format("{}: precondition failed ({}): the object changed", what, server));
    }
    if (code == "NoSuchBucket") {
      return NotFoundError(fmt::format("{}: bucket s3://{} does not exist ({})", what, o_.bucket, server));
    }
    if (r.status == 404) return NotFoundError(fmt::format("{}: not found ({})", what, server));
    if (code == "AccessDenied" || code == "AllAccessDisabled") {
      return PermissionDeniedError(fmt::format("{}: access denied ({}). The credentials ({}) need {} on {}", what, server,
                                               creds_->Source(), action, BucketUrl()));
    }
    if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "InvalidToken") {
      return PermissionDeniedError(fmt::format("{}: S3 refused the credentials from the {} ({}); check the keys and "
                                               "that this machine's clock is right",
                                               what, creds_->Source(), server));
    }
    if (code == "RequestTimeTooSkewed") {
      return PermissionDeniedError(fmt::format("{}: this machine's clock is off by more than 15 minutes ({})", what, server));
    }
    if (r.status == 301 || code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed") {
      return FailedPreconditionError(fmt::format("{}: the bucket is in another region than {} ({}); set AWS_REGION", what,
                                                 region_, server));
    }
    return InvalidArgumentError(fmt::format("{}: {}", what, server));
  }

  // The crc32c S3 keeps for the whole object (FULL_OBJECT, or a single
  // PutObject); a multipart object with a composite checksum ("...-N")
  // cannot be compared with the bytes' own, and is left to the caller's
  // check against the manifest.
  Status CheckCrc(const HttpResponse& r, std::uint32_t local, const std::string& name) {
    std::string h = r.Header("x-amz-checksum-crc32c");
    if (h.empty() || h.find('-') != std::string::npos || r.Header("x-amz-checksum-type") == "COMPOSITE") return OkStatus();
    auto server = Crc32cFromBase64(Trim(h));
    if (server.ok() && *server != local) {
      return UnavailableError(fmt::format("downloading {}: crc32c mismatch (got {}, S3 says {}): corrupted in transit",
                                          Url(name), Crc32cToBase64(local), Crc32cToBase64(*server)));
    }
    return OkStatus();
  }

  // Remembers the ETag behind a generation, for If-Match.
  std::int64_t Learn(const std::string& etag_header) {
    std::string etag = Unquote(etag_header);
    if (etag.empty()) return 0;
    auto g = S3GenerationOf(etag);
    std::lock_guard lk(mu_);
    if (etags_.size() > 200'000) etags_.clear();
    etags_[g] = etag;
    return g;
  }

  // The ETag of `name` if its generation is `gen`: from memory, else a HEAD.
  // kFailedPrecondition when the object is another one now; kNotFound when
  // it is gone.
  StatusOr<std::string> EtagFor(const std::string& name, std::int64_t gen, const CallContext& ctx) {
    {
      std::lock_guard lk(mu_);
      auto it = etags_.find(gen);
      if (it != etags_.end()) return it->second;
    }
    auto r = Call("HEAD", Key(name), "", {}, "", ctx);
    if (!r.ok()) return r.status();
    if (r->status == 404) return NotFoundError(Url(name) + " is gone");
    if (r->status != 200) return Error(*r, "reading " + Url(name), "s3:GetObject");
    if (Learn(r->Header("etag")) != gen) {
      return FailedPreconditionError(fmt::format("{}: precondition failed: the object changed", Url(name)));
    }
    return Unquote(r->Header("etag"));
  }

  std::vector<std::pair<std::string, std::string>> Conditions(const std::string& name, const Precondition& pre,
                                                              const CallContext& ctx, Status* error) {
    std::vector<std::pair<std::string, std::string>> h;
    if (!pre.if_generation_match) return h;
    if (*pre.if_generation_match == 0) {
      h.emplace_back("If-None-Match", "*");
      return h;
    }
    auto etag = EtagFor(name, *pre.if_generation_match, ctx);
    if (!etag.ok()) {
      *error = etag.status().code() == StatusCode::kNotFound
                   ? FailedPreconditionError(Url(name) + ": precondition failed: the object is gone")
                   : etag.status();
      return h;
    }
    h.emplace_back("If-Match", "\"" + *etag + "\"");
    return h;
  }

  // Content type and x-amz-meta-* from S3Options::describe.
  void AddDescription(const std::string& name, std::vector<std::pair<std::string, std::string>>& h) const {
    if (!o_.describe) return;
    auto d = o_.describe(name);
    if (!d.content_type.empty()) h.emplace_back("Content-Type", HeaderSafe(d.content_type));
    for (auto const& [k, v] : d.metadata) h.emplace_back("x-amz-meta-" + AwsUriEncode(k, false), HeaderSafe(v));
  }

  StatusOr<ObjectInfo> Put(const std::string& name, std::string_view data, std::uint32_t crc, const Precondition& pre,
                           bool sign_payload, const CallContext& ctx) {
    Status cond;
    auto headers = Conditions(name, pre, ctx, &cond);
    if (!cond.ok()) return cond;
    headers.emplace_back("x-amz-checksum-crc32c", Crc32cToBase64(crc));
    AddDescription(name, headers);
    auto r = Call("PUT", Key(name), "", headers, data, ctx, {}, sign_payload);
    if (!r.ok()) return r.status();
    if (r->status != 200) return Error(*r, "uploading " + Url(name), "s3:PutObject");
    if (auto echoed = r->Header("x-amz-checksum-crc32c"); !echoed.empty()) {
      auto server = Crc32cFromBase64(Trim(echoed));
      if (server.ok() && *server != crc) {
        return UnavailableError(fmt::format("uploading {}: S3 stored crc32c {} but we sent {}", Url(name),
                                            Crc32cToBase64(*server), Crc32cToBase64(crc)));
      }
    }
    auto gen = Learn(r->Header("etag"));
    if (gen == 0) return UnavailableError("uploading " + Url(name) + ": no ETag in S3's answer");
    return ObjectInfo{name, gen, data.size(), crc};
  }

  std::uint64_t PartBytes(std::uint64_t size) const {
    return std::max<std::uint64_t>(o_.part_min_bytes, (size + 9999) / 10000);
  }

  // CreateMultipartUpload, the parts in parallel (each on a transfer slot,
  // each with its crc32c), then CompleteMultipartUpload with the crc32c of
  // the whole combined from the parts' (S3 checks it: FULL_OBJECT) and the
  // write's precondition. Any failure aborts the upload.
  StatusOr<ObjectInfo> MultipartUpload(const std::string& name, const std::string& path, std::uint64_t size,
                                       const Precondition& pre, const CallContext& ctx) {
    const std::uint64_t part = PartBytes(size);
    const std::size_t n = static_cast<std::size_t>((size + part - 1) / part);
    auto upload_id = Retry(ctx, [&]() -> StatusOr<std::string> {
      std::vector<std::pair<std::string, std::string>> h = {{"x-amz-checksum-algorithm", "CRC32C"},
                                                            {"x-amz-checksum-type", "FULL_OBJECT"}};
      AddDescription(name, h);
      auto r = Call("POST", Key(name), "uploads=", h, "", ctx);
      if (!r.ok()) return r.status();
      if (r->status != 200) return Error(*r, "starting upload of " + Url(name), "s3:PutObject");
      auto id = XmlText(r->body, "UploadId");
      if (!id || id->empty() || id->size() > 1024) return UnavailableError("CreateMultipartUpload: no UploadId in S3's answer");
      return *id;
    });
    if (!upload_id.ok()) return upload_id.status();
    std::string id_q = "uploadId=" + AwsUriEncode(*upload_id, false);
    struct Part {
      std::string etag;
      std::uint32_t crc = 0;
      std::uint64_t size = 0;
    };
    std::vector<Part> parts(n);
    auto sent = ParallelFor(n, slots_.Capacity(ctx), [&](std::size_t i) -> Status {
      Slot slot(slots_, ctx);
      if (!slot.status().ok()) return slot.status();
      std::uint64_t off = i * part;
      std::size_t len = static_cast<std::size_t>(std::min(part, size - off));
      PooledBuffer pooled;  // kept for the next part: no fresh 8 MiB per part
      std::string& buf = *pooled;
      auto st = Retry(ctx, [&]() -> Status {
        Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
        if (f.fd < 0) return ErrnoToStatus(errno, "opening " + path);
        if (auto s = ReadAt(f.fd, off, len, buf); !s.ok()) return Status(s.code(), s.message() + " " + path);
        if (buf.size() != len) return FailedPreconditionError(path + " changed size while being uploaded");
        if (auto s = StillNamed(f.fd, path); !s.ok()) return s;  // let a replaced save go now
        std::uint32_t crc = Crc32c(buf);
        auto r = Call("PUT", Key(name), fmt::format("partNumber={}&{}", i + 1, id_q),
                      {{"x-amz-checksum-crc32c", Crc32cToBase64(crc)}}, buf, ctx, {}, /*sign_payload=*/false);
        if (!r.ok()) return r.status();
        if (r->status != 200) return Error(*r, fmt::format("uploading part {} of {}", i + 1, Url(name)), "s3:PutObject");
        std::string etag = Unquote(r->Header("etag"));
        if (etag.empty()) return UnavailableError("UploadPart: no ETag in S3's answer");
        parts[i] = Part{etag, crc, len};
        return OkStatus();
      });
      if (st.ok()) ctx.Moved(static_cast<std::int64_t>(len));
      return st;
    });
    // Best effort, and even when `ctx` was cancelled: the parts are billed
    // until the upload is aborted. Never past the caller's deadline,
    // though: after a Spot notice that is the machine being taken, and the
    // report of what was uploaded comes after this. What is not aborted
    // here is by the next boot's CheckAccess (after a day) or the bucket's
    // AbortIncompleteMultipartUpload rule.
    auto abort = [&] {
      CallContext short_ctx;
      short_ctx.clock = o_.clock;
      auto by = o_.clock->Now() + std::chrono::seconds(5);
      if (ctx.deadline && *ctx.deadline < by) by = *ctx.deadline;
      if (by <= o_.clock->Now()) return;
      short_ctx.deadline = by;
      (void)Call("DELETE", Key(name), id_q, {}, "", short_ctx);
    };
    if (!sent.ok()) {
      abort();
      return sent;
    }
    std::uint32_t crc = 0;
    for (std::size_t i = 0; i < n; ++i) crc = i == 0 ? parts[i].crc : Crc32cCombine(crc, parts[i].crc, parts[i].size);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) {
      abort();
      return FailedPreconditionError(path + " changed size while being uploaded");
    }
    std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
    for (std::size_t i = 0; i < n; ++i) {
      body += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>\"{}\"</ETag><ChecksumCRC32C>{}</ChecksumCRC32C></Part>",
                          i + 1, XmlEscape(parts[i].etag), Crc32cToBase64(parts[i].crc));
    }
    body += "</CompleteMultipartUpload>";
    auto done = Retry(ctx, [&]() -> StatusOr<ObjectInfo> {
      Status cond;
      auto h = Conditions(name, pre, ctx, &cond);
      if (!cond.ok()) return cond;
      h.emplace_back("x-amz-checksum-crc32c", Crc32cToBase64(crc));
      h.emplace_back("x-amz-checksum-type", "FULL_OBJECT");
      h.emplace_back("Content-Type", "application/xml");
      auto r = Call("POST", Key(name), id_q, h, body, ctx);
      if (!r.ok()) return r.status();
      // CompleteMultipartUpload may answer 200 with an error in the body.
      bool error_body = r->body.find("<Error>") != std::string::npos;
      if (r->status == 404 && XmlText(r->body, "Code").value_or("") == "NoSuchUpload") {
        // The answer to an earlier attempt was lost (libcurl itself sends a
        // request again when a kept-alive connection dies before any answer)
        // and the upload is done: the object is there if its crc32c is ours.
        return Completed(name, size, crc, ctx);
      }
      if (r->status != 200 || error_body) return Error(*r, "completing upload of " + Url(name), "s3:PutObject");
      auto etag = XmlText(r->body, "ETag");
      auto gen = etag ? Learn(*etag) : 0;
      if (gen == 0) return UnavailableError("CompleteMultipartUpload: no ETag in S3's answer");
      return ObjectInfo{name, gen, size, crc};
    });
    if (!done.ok()) abort();
    return done;
  }

  StatusOr<ObjectInfo> Completed(const std::string& name, std::uint64_t size, std::uint32_t crc, const CallContext& ctx) {
    auto r = Call("HEAD", Key(name), "", {{"x-amz-checksum-mode", "ENABLED"}}, "", ctx);
    if (!r.ok()) return r.status();
    auto server = Crc32cFromBase64(Trim(r->Header("x-amz-checksum-crc32c")));
    if (r->status != 200 || !server.ok() || *server != crc) {
      return UnavailableError(fmt::format("completing upload of {}: the upload is gone and the object is not ours", Url(name)));
    }
    return ObjectInfo{name, Learn(r->Header("etag")), size, crc};
  }

  void AbortLeftovers(const CallContext& ctx) {
    auto r = Call("GET", "", "uploads=&prefix=" + AwsUriEncode(FullName(""), false), {}, "", ctx);
    if (!r.ok() || r->status != 200) return;
    auto now = o_.clock->WallNow();
    std::size_t at = 0;
    for (int k = 0; k < 1000; ++k) {
      auto a = r->body.find("<Upload>", at);
      if (a == std::string::npos) break;
      auto b = r->body.find("</Upload>", a);
      if (b == std::string::npos) break;
      std::string_view block(r->body.data() + a, b - a);
      at = b;
      auto key = XmlText(block, "Key"), id = XmlText(block, "UploadId"), initiated = XmlText(block, "Initiated");
      if (!key || !id || !initiated) continue;
      auto when = ParseRfc3339(*initiated);
      if (!when || now - *when < std::chrono::hours(24)) continue;
      if (!o_.prefix.empty() && key->rfind(o_.prefix + "/", 0) != 0) continue;
      (void)Call("DELETE", AwsUriEncode(*key, true), "uploadId=" + AwsUriEncode(*id, false), {}, "", ctx);
    }
  }

  // A large object as byte ranges in parallel, written in place. The first
  // range pins the object: every other range carries If-Match with its
  // ETag, so a replaced object fails the download instead of mixing.
  StatusOr<ObjectInfo> RangedDownload(const std::string& name, const std::string& path, std::uint64_t size,
                                      const CallContext& ctx) {
    auto created = CreateForRanges(path, size);
    if (!created.ok()) return created.status();
    Fd f{*created};
    const std::uint64_t part = std::max<std::uint64_t>(o_.part_min_bytes, (size + 31) / 32);
    const std::size_t n = static_cast<std::size_t>((size + part - 1) / part);
    struct Range {
      std::uint32_t crc = 0;
      std::uint64_t got = 0;
    };
    std::vector<Range> ranges(n);
    std::mutex mu, file_mu;
    std::string etag;
    auto fetch = [&](std::size_t i) -> Status {
      std::uint64_t first = i * part, last = std::min(size, first + part) - 1;
      Slot slot(slots_, ctx);
      if (!slot.status().ok()) return slot.status();
      std::uint64_t counted = 0;
      return Retry(ctx, [&]() -> Status {
        ctx.Moved(-static_cast<std::int64_t>(counted));
        counted = 0;
        std::vector<std::pair<std::string, std::string>> h = {{"Range", fmt::format("bytes={}-{}", first, last)}};
        {
          std::lock_guard lk(mu);
          if (!etag.empty()) h.emplace_back("If-Match", "\"" + etag + "\"");
        }
        const std::string where = Url(name);
        RangeWriter rg{f.fd, first, last - first + 1, path, where, ctx, counted, &file_mu};
        auto on_body = [&rg](std::string_view chunk) { return rg.Feed(chunk); };
        auto r = Call("GET", Key(name), "", h, "", ctx, on_body);
        if (!rg.error.ok()) return rg.error;
        if (!r.ok()) return r.status();
        if (r->status == 412) {
          return FailedPreconditionError(fmt::format("downloading {}: the object was replaced during the download", Url(name)));
        }
        if (r->status != 206) {
          if (r->status == 200) return UnavailableError(fmt::format("downloading {}: S3 ignored the byte range", Url(name)));
          return Error(*r, "downloading " + Url(name), "s3:GetObject");
        }
        auto total = ParseContentRangeTotal(r->Header("content-range"));
        if (!total || *total != size) {
          return FailedPreconditionError(fmt::format(
              "downloading {}: the object is not the {} bytes the manifest names (Content-Range \"{}\")", Url(name), size,
              output::EscapeInvalidUtf8(r->Header("content-range").substr(0, 100))));
        }
        if (rg.got != last - first + 1) return UnavailableError(fmt::format("downloading {}: a range came back short", Url(name)));
        std::lock_guard lk(mu);
        if (etag.empty()) etag = Unquote(r->Header("etag"));
        ranges[i] = Range{rg.crc, rg.got};
        return OkStatus();
      });
    };
    if (auto st = fetch(0); !st.ok()) return st;
    if (auto st = ParallelFor(n - 1, slots_.Capacity(ctx), [&](std::size_t k) { return fetch(k + 1); }); !st.ok()) {
      return st;
    }
    std::uint32_t crc = 0;
    for (std::size_t i = 0; i < n; ++i) crc = i == 0 ? ranges[i].crc : Crc32cCombine(crc, ranges[i].crc, ranges[i].got);
    if (fsync(f.fd) != 0) return ErrnoToStatus(errno, "flushing " + path);
    return ObjectInfo{name, Learn(etag), size, crc};
  }

  S3Options o_;
  std::unique_ptr<AwsCredentialProvider> creds_;
  TransferSlots slots_;
  HttpPool http_;
  SystemClock system_clock_;
  CancellableSleeper default_sleeper_;
  StoreRetry retry_;
  bool aws_endpoint_ = false;
  std::mutex mu_;
  std::string region_;
  std::map<std::int64_t, std::string> etags_;
};

}  // namespace

std::string S3EndpointFromEnv() {
  std::string e = Env("AWS_ENDPOINT_URL_S3");
  if (e.empty()) e = Env("AWS_ENDPOINT_URL");
  return e;
}

std::string S3RegionFromEnv() {
  std::string r = Env("AWS_REGION");
  if (r.empty()) r = Env("AWS_DEFAULT_REGION");
  return r.empty() ? "us-east-1" : r;
}

std::unique_ptr<ObjectStore> MakeS3ObjectStore(S3Options options, std::unique_ptr<AwsCredentialProvider> credentials) {
  return std::make_unique<S3ObjectStore>(std::move(options), std::move(credentials));
}

}  // namespace spotvisor
