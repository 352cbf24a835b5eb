#include "storage/gcs_object_store.h"

#include "common/random.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "output/utf8.h"
#include "retry/retry_loop.h"
#include "storage/crc32c.h"
#include "storage/range_header.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;
constexpr std::size_t kQuantum = 256 * 1024;  // resumable chunks are multiples of this

std::string ServerMessage(const HttpResponse& r) {
  auto j = Json::parse(r.body, nullptr, false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_object()) {
      auto m = e->find("message");
      if (m != e->end() && m->is_string()) return output::EscapeInvalidUtf8(m->get<std::string>());
    }
  }
  return output::EscapeInvalidUtf8(r.body.substr(0, 200));
}

// HTTP answers → Status, naming what a user can act on.
Status HttpError(const HttpResponse& r, const std::string& what, const std::string& bucket_url) {
  std::string server = ServerMessage(r);
  switch (r.status) {
    case 401:
    case 403:
      return PermissionDeniedError(fmt::format(
          "{}: permission denied (HTTP {}: {}). The VM's service account needs roles/storage.objectAdmin on {}, "
          "and the VM an access scope that allows writes (--scopes=storage-rw or storage-full; the default "
          "storage scope is read-only)",
          what, r.status, server, bucket_url));
    case 404: return NotFoundError(fmt::format("{}: not found (HTTP 404: {})", what, server));
    case 412: return FailedPreconditionError(fmt::format("{}: precondition failed (HTTP 412): the object changed", what));
    case 429:
      return UnavailableError(fmt::format("{}: rate limited (HTTP 429: {}); if this persists, check the project's "
                                          "Cloud Storage quota",
                                          what, server));
    case 408: return UnavailableError(fmt::format("{}: request timeout (HTTP 408)", what));
    default:
      if (r.status >= 500) return UnavailableError(fmt::format("{}: HTTP {}: {}", what, r.status, server));
      return InvalidArgumentError(fmt::format("{}: HTTP {}: {}", what, r.status, server));
  }
}

// An object resource from the server: every field checked, nothing thrown.
StatusOr<ObjectInfo> ParseObject(const Json& j, const std::string& prefix) {
  auto name = j.is_object() ? j.find("name") : j.end();
  if (!j.is_object() || name == j.end() || !name->is_string()) return UnavailableError("unexpected object resource");
  ObjectInfo o;
  std::string full = name->get<std::string>();
  if (!prefix.empty() && full.rfind(prefix + "/", 0) != 0) return UnavailableError("object outside the prefix: " + full);
  o.name = prefix.empty() ? full : full.substr(prefix.size() + 1);
  // GCS sends int64/uint64 fields as decimal strings.
  auto number = [&](const char* key) -> std::optional<std::uint64_t> {
    auto it = j.find(key);
    if (it == j.end()) return std::uint64_t{0};
    if (it->is_number_unsigned()) return it->get<std::uint64_t>();
    if (!it->is_string()) return std::nullopt;
    auto v = ParseUint64(it->get<std::string>());
    if (!v) return std::nullopt;
    return *v;
  };
  auto gen = number("generation");
  auto size = number("size");
  if (!gen || !size || *gen > static_cast<std::uint64_t>(INT64_MAX)) return UnavailableError("malformed object resource for " + full);
  o.generation = static_cast<std::int64_t>(*gen);
  o.size = *size;
  if (auto c = j.find("crc32c"); c != j.end() && c->is_string()) {
    auto crc = Crc32cFromBase64(c->get<std::string>());
    if (crc.ok()) o.crc32c = *crc;
  }
  return o;
}

StatusOr<ObjectInfo> ParseObject(const std::string& body, const std::string& prefix) {
  auto j = Json::parse(body, nullptr, false);
  auto o = ParseObject(j, prefix);
  if (!o.ok()) return UnavailableError(o.status().message() + ": " + output::EscapeInvalidUtf8(body.substr(0, 200)));
  return o;
}

// x-goog-generation, checked; 0 when absent or malformed.
std::int64_t HeaderGeneration(const HttpResponse& r) {
  auto v = ParseUint64(r.Header("x-goog-generation"));
  return v && *v <= static_cast<std::uint64_t>(INT64_MAX) ? static_cast<std::int64_t>(*v) : 0;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

StatusOr<std::string> ReadChunk(int fd, std::size_t max) {
  std::string buf(max, '\0');
  std::size_t got = 0;
  while (got < max) {
    ssize_t n = read(fd, buf.data() + got, max - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "reading");
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  buf.resize(got);
  return buf;
}

class GcsObjectStore final : public ObjectStore {
 public:
  GcsObjectStore(GcsOptions o, std::unique_ptr<TokenProvider> tokens) : o_(std::move(o)), tokens_(std::move(tokens)) {
    if (!o_.make_retry) o_.make_retry = [] { return std::make_unique<LimitedErrorCountRetryPolicy>(6); };
    if (!o_.make_backoff) {
      o_.make_backoff = [] { return std::make_unique<ExponentialBackoffPolicy>(std::chrono::seconds(1), std::chrono::seconds(32), 2.0); };
    }
    if (!o_.sleeper) o_.sleeper = &default_sleeper_;
    o_.chunk_bytes = std::max(kQuantum, o_.chunk_bytes / kQuantum * kQuantum);
  }

  std::string Describe() const override { return BucketUrl(); }

  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override {
    return Retry(ctx, kWrite, [&] { return Multipart(name, data, Crc32c(data), pre, ctx); });
  }

  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "uploading " + path);
    auto size = static_cast<std::size_t>(st.st_size);
    if (size <= o_.multipart_max_bytes) {
      return Retry(ctx, kWrite, [&]() -> StatusOr<ObjectInfo> {
        Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
        if (f.fd < 0) return ErrnoToStatus(errno, "opening " + path);
        auto data = ReadChunk(f.fd, size + 1);
        if (!data.ok()) return data.status();
        if (data->size() != size) return FailedPreconditionError(path + " changed size while being read");
        return Multipart(name, *data, Crc32c(*data), pre, ctx);
      });
    }
    return Resumable(name, path, size, pre, ctx);
  }

  StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) override {
    return Retry(ctx, Idempotency::kIdempotent, [&]() -> StatusOr<std::string> {
      HttpRequest req = Request("GET", ObjectUrl(name) + "?alt=media");
      auto r = Perform(req, ctx);
      if (!r.ok()) return r.status();
      if (r->status != 200) return HttpError(*r, "reading " + Url(name), BucketUrl());
      auto crc = CheckHash(*r, Crc32c(r->body), name);
      if (!crc.ok()) return crc.status();
      if (info) *info = ObjectInfo{name, HeaderGeneration(*r), r->body.size(), *crc};
      return std::move(r->body);
    });
  }

  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, const CallContext& ctx) override {
    return Retry(ctx, Idempotency::kIdempotent, [&]() -> StatusOr<ObjectInfo> {
      Fd f{open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
      if (f.fd < 0) return ErrnoToStatus(errno, "creating " + path);
      std::uint32_t crc = 0;
      std::uint64_t size = 0;
      Status write_error;
      HttpRequest req = Request("GET", ObjectUrl(name) + "?alt=media");
      req.timeout = std::chrono::hours(24);  // bounded by low_speed_limit instead
      req.low_speed_limit = 1024;
      req.on_body = [&](std::string_view chunk) {
        crc = Crc32cExtend(crc, chunk);
        size += chunk.size();
        while (!chunk.empty()) {
          ssize_t n = write(f.fd, chunk.data(), chunk.size());
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            write_error = ErrnoToStatus(errno, "writing " + path);
            return false;
          }
          chunk.remove_prefix(static_cast<std::size_t>(n));
        }
        return true;
      };
      auto r = Perform(req, ctx);
      // Disk full is the user's problem to fix, not the network's: no retry.
      if (!write_error.ok()) {
        return write_error.code() == StatusCode::kInternal ? FailedPreconditionError(write_error.message()) : write_error;
      }
      if (!r.ok()) return r.status();
      if (r->status != 200) return HttpError(*r, "downloading " + Url(name), BucketUrl());
      auto checked = CheckHash(*r, crc, name);
      if (!checked.ok()) return checked.status();
      if (fsync(f.fd) != 0) return ErrnoToStatus(errno, "flushing " + path);
      return ObjectInfo{name, HeaderGeneration(*r), size, crc};
    });
  }

  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) override {
    std::vector<ObjectInfo> out;
    std::string token;
    do {
      auto page = Retry(ctx, Idempotency::kIdempotent, [&]() -> StatusOr<Json> {
        std::string url = fmt::format("{}/storage/v1/b/{}/o?prefix={}&fields={}", o_.endpoint, o_.bucket,
                                      UrlEncode(FullName(prefix)), UrlEncode("items(name,generation,size,crc32c),nextPageToken"));
        if (!token.empty()) url += "&pageToken=" + UrlEncode(token);
        auto r = Perform(Request("GET", url), ctx);
        if (!r.ok()) return r.status();
        if (r->status != 200) return HttpError(*r, "listing " + BucketUrl(), BucketUrl());
        auto j = Json::parse(r->body, nullptr, false);
        if (!j.is_object()) return UnavailableError("listing " + BucketUrl() + ": not JSON");
        return j;
      });
      if (!page.ok()) return page.status();
      auto items = page->find("items");
      if (items != page->end() && items->is_array()) {
        for (auto const& item : *items) {
          auto o = ParseObject(item, o_.prefix);
          if (o.ok()) out.push_back(*o);
        }
      }
      auto next = page->find("nextPageToken");
      token = next != page->end() && next->is_string() ? next->get<std::string>() : "";
    } while (!token.empty());
    return out;
  }

  // A one-item list: it needs storage.objects.list only, which
  // roles/storage.objectAdmin has (unlike storage.buckets.get).
  Status CheckAccess(const CallContext& ctx) override {
    return Retry(ctx, Idempotency::kIdempotent, [&]() -> Status {
      auto r = Perform(Request("GET", fmt::format("{}/storage/v1/b/{}/o?maxResults=1&prefix={}&fields=items(name)", o_.endpoint,
                                                  o_.bucket, UrlEncode(FullName("")))),
                       ctx);
      if (!r.ok()) return r.status();
      if (r->status == 200) return OkStatus();
      if (r->status == 404) {
        return NotFoundError(fmt::format("bucket gs://{} does not exist (HTTP 404: {})", o_.bucket, ServerMessage(*r)));
      }
      return HttpError(*r, "listing " + BucketUrl(), BucketUrl());
    });
  }

  Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) override {
    // A repeated delete meets 404, which counts as done.
    auto s = Retry(ctx, Idempotency::kIdempotent, [&]() -> Status {
      auto r = Perform(Request("DELETE", ObjectUrl(name) + Query(pre, '?')), ctx);
      if (!r.ok()) return r.status();
      if (r->status == 204 || r->status == 200 || r->status == 404) return OkStatus();
      return HttpError(*r, "deleting " + Url(name), BucketUrl());
    });
    return s;
  }

 private:
  // Google's retry strategy, bounded by the context: every wait ends at the
  // deadline or on cancellation, and an urgent context (the final sync in a
  // Spot window) retries quickly until its deadline instead of backing off
  // to 32 s.
  //
  // Writing an object is safe to repeat for every object spotvisor writes:
  // with a precondition (manifest.json) a replay meets 412, which the sync
  // engine reconciles by commit id; without one the name is written once
  // (checkpoints/PATH~SEQ.NONCE, a new nonce per sync) or again with the same
  // bytes (DONE).
  static constexpr Idempotency kWrite = Idempotency::kIdempotent;
  template <typename Fn>
  auto Retry(const CallContext& ctx, Idempotency idempotency, Fn&& fn) -> decltype(fn()) {
    using Result = decltype(fn());
    if (auto s = ctx.Check("request"); !s.ok()) return Result(s);
    std::unique_ptr<RetryPolicy> retry;
    std::unique_ptr<BackoffPolicy> backoff;
    if (ctx.urgent && ctx.deadline) {
      retry = std::make_unique<RetryForeverPolicy>();
      backoff = std::make_unique<ExponentialBackoffPolicy>(std::chrono::milliseconds(100), std::chrono::seconds(1), 2.0);
    } else {
      retry = o_.make_retry();
      backoff = o_.make_backoff();
    }
    ContextSleeper sleeper(ctx, o_.sleeper);
    auto result = RetryLoop(*retry, *backoff, idempotency, sleeper, [&]() -> Result {
      if (auto s = ctx.Check("request"); !s.ok()) return Result(s);
      return fn();
    });
    // A wait cut short by the deadline reads better as what it is.
    Status st = internal::StatusOf(result);
    if (st.code() == StatusCode::kCancelled && !ctx.cancelled() && ctx.deadline) {
      return Result(DeadlineExceededError("out of time after: " + st.message()));
    }
    return result;
  }

  // Backoff waits: the injected sleeper (tests) for the delay, cut short by
  // the context's cancellation and never running past its deadline.
  class ContextSleeper final : public Sleeper {
   public:
    ContextSleeper(const CallContext& ctx, Sleeper* inner) : ctx_(ctx), inner_(inner) {}
    bool SleepFor(std::chrono::milliseconds d) override {
      if (ctx_.cancelled()) return false;
      if (ctx_.deadline && ctx_.Remaining(d) < d) return false;  // the next attempt would start too late
      if (inner_) return inner_->SleepFor(d) && !ctx_.cancelled();
      return ctx_.SleepFor(d);
    }

   private:
    const CallContext& ctx_;
    Sleeper* inner_;
  };

  std::string FullName(const std::string& name) const { return o_.prefix.empty() ? name : o_.prefix + "/" + name; }
  std::string BucketUrl() const { return o_.prefix.empty() ? "gs://" + o_.bucket : fmt::format("gs://{}/{}", o_.bucket, o_.prefix); }
  std::string Url(const std::string& name) const { return fmt::format("gs://{}/{}", o_.bucket, FullName(name)); }
  std::string ObjectUrl(const std::string& name) const {
    return fmt::format("{}/storage/v1/b/{}/o/{}", o_.endpoint, o_.bucket, UrlEncode(FullName(name)));
  }
  static std::string Query(const Precondition& pre, char sep) {
    return pre.if_generation_match ? fmt::format("{}ifGenerationMatch={}", sep, *pre.if_generation_match) : "";
  }

  HttpRequest Request(const std::string& method, const std::string& url) {
    HttpRequest r;
    r.method = method;
    r.url = url;
    r.timeout = std::chrono::minutes(5);
    return r;
  }

  // One request, its timeout clamped to what the context has left, cut
  // short at once if the context is cancelled meanwhile.
  StatusOr<HttpResponse> Perform(HttpRequest req, const CallContext& ctx) {
    if (auto s = ctx.Check(req.method + " " + req.url); !s.ok()) return s;
    auto auth = tokens_->AuthorizationHeader(ctx);
    if (!auth.ok()) return auth.status();
    if (!auth->empty()) req.headers.emplace_back("Authorization", *auth);
    if (ctx.deadline) {
      auto left = ctx.Remaining(req.timeout);
      if (left.count() <= 0) return DeadlineExceededError(req.url + ": out of time");
      req.timeout = left;
      req.connect_timeout = std::min(req.connect_timeout, left);
    }
    auto http = AcquireHttp();
    std::shared_ptr<HttpClient> shared(std::move(http));
    std::uint64_t sub = 0;
    if (ctx.cancel) sub = ctx.cancel->Subscribe([shared] { shared->Cancel(); });
    auto r = shared->Perform(req);
    if (ctx.cancel) ctx.cancel->Unsubscribe(sub);
    // A cancelled handle stays cancelled: it is not given back to the pool.
    if (!ctx.cancelled()) ReleaseHttp(shared);
    return r;
  }

  // One curl handle per concurrent request, reused so connections are kept alive.
  std::shared_ptr<HttpClient> AcquireHttp() {
    std::lock_guard lk(pool_mu_);
    if (pool_.empty()) return o_.make_http();
    auto h = std::move(pool_.back());
    pool_.pop_back();
    return h;
  }
  void ReleaseHttp(std::shared_ptr<HttpClient> h) {
    std::lock_guard lk(pool_mu_);
    pool_.push_back(std::move(h));
  }

  StatusOr<std::uint32_t> CheckHash(const HttpResponse& r, std::uint32_t local, const std::string& name) {
    // x-goog-hash: crc32c=...,md5=...
    std::string h = r.Header("x-goog-hash");
    auto pos = h.find("crc32c=");
    if (pos == std::string::npos) return local;  // composite objects may lack it; nothing to compare
    auto end = h.find(',', pos);
    auto server = Crc32cFromBase64(h.substr(pos + 7, end == std::string::npos ? std::string::npos : end - pos - 7));
    if (server.ok() && *server != local) {
      return UnavailableError(fmt::format("downloading {}: crc32c mismatch (got {}, server says {}): corrupted in transit",
                                          Url(name), Crc32cToBase64(local), Crc32cToBase64(*server)));
    }
    return local;
  }

  // The object resource sent with an upload: its name, and what
  // GcsOptions::describe says about it.
  Json Describe(const std::string& name) const {
    Json meta = {{"name", FullName(name)}};
    if (!o_.describe) return meta;
    auto d = o_.describe(name);
    if (!d.content_type.empty()) meta["contentType"] = d.content_type;
    if (!d.metadata.empty()) meta["metadata"] = d.metadata;
    return meta;
  }

  StatusOr<ObjectInfo> Multipart(const std::string& name, const std::string& data, std::uint32_t crc,
                                 const Precondition& pre, const CallContext& ctx) {
    Json meta = Describe(name);
    meta["crc32c"] = Crc32cToBase64(crc);
    std::string boundary;
    std::mt19937_64 rng(RandomSeed());
    do {
      boundary = fmt::format("spotvisor-{:016x}", rng());
    } while (data.find(boundary) != std::string::npos);
    std::string body = fmt::format("--{}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{}\r\n--{}\r\n"
                                   "Content-Type: application/octet-stream\r\n\r\n",
                                   boundary, meta.dump(-1, ' ', false, Json::error_handler_t::replace), boundary);
    body += data;
    body += fmt::format("\r\n--{}--\r\n", boundary);
    auto req = Request("POST", fmt::format("{}/upload/storage/v1/b/{}/o?uploadType=multipart{}", o_.endpoint, o_.bucket,
                                           Query(pre, '&')));
    req.headers = {{"Content-Type", "multipart/related; boundary=" + boundary}};
    req.body = std::move(body);
    auto r = Perform(std::move(req), ctx);
    if (!r.ok()) return r.status();
    if (r->status != 200) return HttpError(*r, "uploading " + Url(name), BucketUrl());
    return Verified(*r, name, crc);
  }

  StatusOr<ObjectInfo> Verified(const HttpResponse& r, const std::string& name, std::uint32_t crc) {
    auto o = ParseObject(r.body, o_.prefix);
    if (!o.ok()) return o.status();
    if (o->crc32c != crc) {
      return UnavailableError(fmt::format("uploading {}: the server stored crc32c {} but we sent {}", Url(name),
                                          Crc32cToBase64(o->crc32c), Crc32cToBase64(crc)));
    }
    return o;
  }

  // Starts a session, then sends chunks; after a failure the session is
  // asked how much it has, and the upload goes on from there.
  StatusOr<ObjectInfo> Resumable(const std::string& name, const std::string& path, std::size_t size,
                                 const Precondition& pre, const CallContext& ctx) {
    // A second session for the same object is harmless: only the one
    // that is finished writes it.
    auto session = Retry(ctx, Idempotency::kIdempotent, [&]() -> StatusOr<std::string> {
      auto req = Request("POST", fmt::format("{}/upload/storage/v1/b/{}/o?uploadType=resumable{}", o_.endpoint, o_.bucket,
                                             Query(pre, '&')));
      req.headers = {{"Content-Type", "application/json; charset=UTF-8"},
                     {"X-Upload-Content-Length", std::to_string(size)}};
      req.body = Describe(name).dump(-1, ' ', false, Json::error_handler_t::replace);
      auto r = Perform(std::move(req), ctx);
      if (!r.ok()) return r.status();
      if (r->status != 200 && r->status != 201) return HttpError(*r, "starting upload of " + Url(name), BucketUrl());
      auto loc = r->Header("location");
      if (loc.empty()) return UnavailableError("resumable upload: no Location in the answer");
      return loc;
    });
    if (!session.ok()) return session.status();
    Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0) return ErrnoToStatus(errno, "opening " + path);

    std::size_t offset = 0;  // what the server has persisted
    std::uint32_t crc = 0;   // crc32c of bytes [0, crc_upto)
    std::size_t crc_upto = 0;
    std::uint32_t final_crc = 0;  // of the whole file, once the last chunk was sent
    bool need_query = false;      // after a failure: ask the session where it is
    return Retry(ctx, kWrite, [&]() -> StatusOr<ObjectInfo> {
      for (;;) {
        if (need_query) {
          auto req = Request("PUT", *session);
          req.headers = {{"Content-Range", fmt::format("bytes */{}", size)}};
          auto r = Perform(std::move(req), ctx);
          if (!r.ok()) return r.status();
          // The last chunk arrived but its answer was lost: the upload is done.
          if (r->status == 200 || r->status == 201) return Verified(*r, name, final_crc);
          if (r->status == 404 || r->status == 410) {
            return FailedPreconditionError(fmt::format("upload session for {} expired (HTTP {})", Url(name), r->status));
          }
          if (r->status != 308) return HttpError(*r, "resuming upload of " + Url(name), BucketUrl());
          auto persisted = PersistedBytes(*r, size);
          if (!persisted.ok()) return persisted.status();  // need_query stays set
          offset = *persisted;
          need_query = false;
        }
        if (offset != crc_upto) {
          // The server kept a different amount than we sent: recompute the
          // running crc32c from the file up to where it stands.
          crc = 0;
          crc_upto = 0;
          if (lseek(f.fd, 0, SEEK_SET) < 0) return ErrnoToStatus(errno, "seeking " + path);
          while (crc_upto < offset) {
            auto part = ReadChunk(f.fd, std::min(o_.chunk_bytes, offset - crc_upto));
            if (!part.ok()) return part.status();
            if (part->empty()) return FailedPreconditionError(path + " shrank while being uploaded");
            crc = Crc32cExtend(crc, *part);
            crc_upto += part->size();
          }
        }
        if (lseek(f.fd, static_cast<off_t>(offset), SEEK_SET) < 0) return ErrnoToStatus(errno, "seeking " + path);
        auto chunk = ReadChunk(f.fd, std::min(o_.chunk_bytes, size - offset));
        if (!chunk.ok()) return chunk.status();
        if (chunk->empty() || (offset + chunk->size() < size && chunk->size() % kQuantum != 0)) {
          return FailedPreconditionError(path + " changed size while being uploaded");
        }
        bool last = offset + chunk->size() == size;
        std::uint32_t chunk_crc = Crc32cExtend(crc, *chunk);
        auto req = Request("PUT", *session);
        req.headers = {{"Content-Range", fmt::format("bytes {}-{}/{}", offset, offset + chunk->size() - 1, size)}};
        if (last) {
          final_crc = chunk_crc;
          // Lets the server reject the object if any byte was corrupted.
          req.headers.emplace_back("x-goog-hash", "crc32c=" + Crc32cToBase64(chunk_crc));
        }
        std::size_t sent = chunk->size();
        req.body = std::move(*chunk);
        auto r = Perform(std::move(req), ctx);
        if (!r.ok()) {
          need_query = true;
          return r.status();
        }
        if (r->status == 200 || r->status == 201) return Verified(*r, name, chunk_crc);
        if (r->status == 308) {
          auto parsed = PersistedBytes(*r, size);
          if (!parsed.ok()) {
            need_query = true;
            return parsed.status();
          }
          std::size_t persisted = *parsed;
          if (persisted == offset + sent) {
            crc = chunk_crc;
            crc_upto = persisted;
          }
          offset = persisted;
          continue;
        }
        auto err = HttpError(*r, "uploading " + Url(name), BucketUrl());
        need_query = !IsPermanentFailure(err);
        return err;
      }
    });
  }

  // "Range: bytes=0-N": N+1 bytes persisted; no Range: none. A malformed
  // header, or one beyond the file, is an error (the session is asked again).
  static StatusOr<std::size_t> PersistedBytes(const HttpResponse& r, std::size_t size) {
    auto n = ParsePersistedRange(r.Header("range"));
    if (!n || *n > size) {
      return UnavailableError("resumable upload: unexpected Range header \"" +
                              output::EscapeInvalidUtf8(r.Header("range").substr(0, 100)) + "\"");
    }
    return static_cast<std::size_t>(*n);
  }

  GcsOptions o_;
  std::unique_ptr<TokenProvider> tokens_;
  CancellableSleeper default_sleeper_;
  std::mutex pool_mu_;
  std::vector<std::shared_ptr<HttpClient>> pool_;
};

}  // namespace


std::string StorageEndpoint(const std::string& configured, bool& auth) {
  const char* emu = std::getenv("STORAGE_EMULATOR_HOST");
  if (emu == nullptr || *emu == '\0') {
    auth = true;
    return configured;
  }
  auth = false;
  std::string e = emu;
  if (!StartsWith(e, "http://") && !StartsWith(e, "https://")) e = "http://" + e;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

std::unique_ptr<ObjectStore> MakeGcsObjectStore(GcsOptions options, std::unique_ptr<TokenProvider> tokens) {
  return std::make_unique<GcsObjectStore>(std::move(options), std::move(tokens));
}

}  // namespace spotvisor
