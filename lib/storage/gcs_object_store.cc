#include "storage/gcs_object_store.h"

#include "common/random.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/buffer_pool.h"
#include "common/parallel_for.h"
#include "common/strings.h"
#include "output/utf8.h"
#include "retry/retry_loop.h"
#include "storage/crc32c.h"
#include "storage/range_header.h"
#include "storage/transfer.h"

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

class GcsObjectStore final : public ObjectStore {
 public:
  GcsObjectStore(GcsOptions o, std::unique_ptr<TokenProvider> tokens)
      : o_(std::move(o)), tokens_(std::move(tokens)), slots_(o_.streams, o_.urgent_streams), http_(o_.make_http) {
    retry_ = StoreRetry{o_.make_retry, o_.make_backoff, o_.sleeper};
    retry_.Defaults(&default_sleeper_);
    o_.chunk_bytes = std::max(kQuantum, o_.chunk_bytes / kQuantum * kQuantum);
    o_.part_min_bytes = std::max(kQuantum, o_.part_min_bytes / kQuantum * kQuantum);
  }

  std::string Describe() const override { return BucketUrl(); }

  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override {
    return Retry(ctx, kWrite, [&] { return Multipart(name, data, Crc32c(data), pre, /*describe=*/true, ctx); });
  }

  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "uploading " + path);
    auto size = static_cast<std::size_t>(st.st_size);
    if (o_.parallel_min_bytes > 0 && size >= o_.parallel_min_bytes && PartCount(size) > 1) {
      return Composite(name, path, size, pre, ctx);
    }
    Slot slot(slots_, ctx);
    if (!slot.status().ok()) return slot.status();
    return UploadRange(name, path, 0, size, pre, /*describe=*/true, ctx);
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

  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, std::uint64_t size_hint,
                                      const CallContext& ctx) override {
    if (o_.parallel_min_bytes > 0 && size_hint >= o_.parallel_min_bytes && PartCount(size_hint) > 1) {
      return RangedDownload(name, path, size_hint, ctx);
    }
    Slot slot(slots_, ctx);
    if (!slot.status().ok()) return slot.status();
    std::uint64_t counted = 0;  // bytes reported by an attempt that may be redone
    return Retry(ctx, Idempotency::kIdempotent, [&]() -> StatusOr<ObjectInfo> {
      ctx.Moved(-static_cast<std::int64_t>(counted));
      counted = 0;
      Fd f{open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
      if (f.fd < 0) return ErrnoToStatus(errno, "creating " + path);
      FileWriter w(f.fd, path, size_hint, ctx, counted);
      HttpRequest req = Request("GET", ObjectUrl(name) + "?alt=media");
      req.timeout = std::chrono::hours(24);  // bounded by low_speed_limit instead
      req.low_speed_limit = 1024;
      req.on_body = [&w](std::string_view chunk) { return w.Feed(chunk); };
      auto r = Perform(req, ctx);
      // Disk full is the user's problem to fix, not the network's: no retry.
      if (!w.error.ok()) return w.error;
      if (!r.ok()) return r.status();
      if (r->status != 200) return HttpError(*r, "downloading " + Url(name), BucketUrl());
      if (auto st = w.Finish(); !st.ok()) return st;
      auto checked = CheckHash(*r, w.crc, name);
      if (!checked.ok()) return checked.status();
      if (fsync(f.fd) != 0) return ErrnoToStatus(errno, "flushing " + path);
      return ObjectInfo{name, HeaderGeneration(*r), w.size, w.crc};
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
  // Writing an object is safe to repeat for every object spotvisor writes:
  // with a precondition (manifest.json) a replay meets 412, which the sync
  // engine reconciles by commit id; without one the name is written once
  // (checkpoints/PATH~SEQ.NONCE, a new nonce per sync) or again with the same
  // bytes (DONE).
  static constexpr Idempotency kWrite = Idempotency::kIdempotent;
  template <typename Fn>
  auto Retry(const CallContext& ctx, Idempotency idempotency, Fn&& fn) -> decltype(fn()) {
    return retry_.Run(ctx, idempotency, std::forward<Fn>(fn));
  }

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
  StatusOr<HttpResponse> Perform(HttpRequest req, const CallContext& ctx) { return Send(req, ctx); }
  // The same, leaving `req` (and its body) with the caller.
  StatusOr<HttpResponse> Send(HttpRequest& req, const CallContext& ctx) {
    if (auto s = ctx.Check(req.method + " " + req.url); !s.ok()) return s;
    auto auth = tokens_->AuthorizationHeader(ctx);
    if (!auth.ok()) return auth.status();
    if (!auth->empty()) req.headers.emplace_back("Authorization", *auth);
    return http_.Send(req, ctx);
  }

  // The crc32c in x-goog-hash ("crc32c=...", with "md5=..." in the same
  // header or a repeated one, which the HTTP client joins with ", ").
  // Absent, or not a crc32c: nullopt, nothing to compare.
  static std::optional<std::uint32_t> HeaderCrc32c(const HttpResponse& r) {
    std::string h = r.Header("x-goog-hash");
    auto pos = h.find("crc32c=");
    if (pos == std::string::npos) return std::nullopt;
    auto end = h.find(',', pos);
    auto server = Crc32cFromBase64(Trim(std::string_view(h).substr(pos + 7, end == std::string::npos ? std::string::npos : end - pos - 7)));
    if (!server.ok()) return std::nullopt;
    return *server;
  }

  StatusOr<std::uint32_t> CheckHash(const HttpResponse& r, std::uint32_t local, const std::string& name) {
    auto server = HeaderCrc32c(r);
    if (server && *server != local) {
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

  StatusOr<ObjectInfo> Multipart(const std::string& name, std::string_view data, std::uint32_t crc,
                                 const Precondition& pre, bool describe, const CallContext& ctx) {
    Json meta = describe ? Describe(name) : Json{{"name", FullName(name)}};
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
  // The object is bytes [base, base + size) of the file at `path`.
  StatusOr<ObjectInfo> Resumable(const std::string& name, const std::string& path, std::uint64_t base, std::size_t size,
                                 const Precondition& pre, bool describe, const CallContext& ctx) {
    // A second session for the same object is harmless: only the one
    // that is finished writes it.
    auto session = Retry(ctx, Idempotency::kIdempotent, [&]() -> StatusOr<std::string> {
      auto req = Request("POST", fmt::format("{}/upload/storage/v1/b/{}/o?uploadType=resumable{}", o_.endpoint, o_.bucket,
                                             Query(pre, '&')));
      req.headers = {{"Content-Type", "application/json; charset=UTF-8"},
                     {"X-Upload-Content-Length", std::to_string(size)}};
      req.body = (describe ? Describe(name) : Json{{"name", FullName(name)}})
                     .dump(-1, ' ', false, Json::error_handler_t::replace);
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

    PooledBuffer pooled;     // one chunk, reused, and kept for the next upload
    std::string& buf = *pooled;
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
          if (r->status == 200 || r->status == 201) {
            ctx.Moved(static_cast<std::int64_t>(size - offset));
            return Verified(*r, name, final_crc);
          }
          if (r->status == 404 || r->status == 410) {
            return FailedPreconditionError(fmt::format("upload session for {} expired (HTTP {})", Url(name), r->status));
          }
          if (r->status != 308) return HttpError(*r, "resuming upload of " + Url(name), BucketUrl());
          auto persisted = PersistedBytes(*r, size);
          if (!persisted.ok()) return persisted.status();  // need_query stays set
          ctx.Moved(static_cast<std::int64_t>(*persisted) - static_cast<std::int64_t>(offset));
          offset = *persisted;
          need_query = false;
        }
        if (offset != crc_upto) {
          // The server kept a different amount than we sent: recompute the
          // running crc32c from the file up to where it stands.
          crc = 0;
          crc_upto = 0;
          while (crc_upto < offset) {
            if (auto st = ReadAt(f.fd, base + crc_upto, std::min(o_.chunk_bytes, offset - crc_upto), buf); !st.ok()) {
              return Status(st.code(), st.message() + " " + path);
            }
            if (buf.empty()) return FailedPreconditionError(path + " shrank while being uploaded");
            crc = Crc32cExtend(crc, buf);
            crc_upto += buf.size();
          }
        }
        if (auto st = ReadAt(f.fd, base + offset, std::min(o_.chunk_bytes, size - offset), buf); !st.ok()) {
          return Status(st.code(), st.message() + " " + path);
        }
        if (auto st = StillNamed(f.fd, path); !st.ok()) return st;  // let a replaced save go now
        const std::string* chunk = &buf;
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
        req.body = std::move(buf);
        auto r = Send(req, ctx);
        buf = std::move(req.body);  // the buffer comes back for the next chunk
        if (!r.ok()) {
          need_query = true;
          return r.status();
        }
        if (r->status == 200 || r->status == 201) {
          ctx.Moved(static_cast<std::int64_t>(size - offset));
          return Verified(*r, name, chunk_crc);
        }
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
          ctx.Moved(static_cast<std::int64_t>(persisted) - static_cast<std::int64_t>(offset));
          offset = persisted;
          continue;
        }
        auto err = HttpError(*r, "uploading " + Url(name), BucketUrl());
        need_query = !IsPermanentFailure(err);
        return err;
      }
    });
  }

  // Parts of a large file: at least part_min_bytes each, at most
  // kMaxComponents of them (compose takes 32 sources), whole 256 KiB units.
  static constexpr std::size_t kMaxComponents = 32;
  std::uint64_t PartBytes(std::uint64_t size) const {
    std::uint64_t part = std::max<std::uint64_t>(o_.part_min_bytes, (size + kMaxComponents - 1) / kMaxComponents);
    return (part + kQuantum - 1) / kQuantum * kQuantum;
  }
  std::size_t PartCount(std::uint64_t size) const {
    return static_cast<std::size_t>((size + PartBytes(size) - 1) / PartBytes(size));
  }

  // Bytes [base, base + size) of `path` as the object `name`: one multipart
  // request when small, a resumable upload otherwise. The caller holds a
  // slot. `describe`: the whole file, as the object the caller named (its
  // description attached, and a file that grew meanwhile refused); else a
  // part.
  StatusOr<ObjectInfo> UploadRange(const std::string& name, const std::string& path, std::uint64_t base,
                                   std::size_t size, const Precondition& pre, bool describe, const CallContext& ctx) {
    if (size > o_.multipart_max_bytes) return Resumable(name, path, base, size, pre, describe, ctx);
    auto r = Retry(ctx, kWrite, [&]() -> StatusOr<ObjectInfo> {
      Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
      if (f.fd < 0) return ErrnoToStatus(errno, "opening " + path);
      std::string data;
      // One byte more than expected shows a file that grew.
      if (auto st = ReadAt(f.fd, base, size + (describe ? 1 : 0), data); !st.ok()) {
        return Status(st.code(), st.message() + " " + path);
      }
      if (data.size() != size) return FailedPreconditionError(path + " changed size while being read");
      return Multipart(name, data, Crc32c(data), pre, describe, ctx);
    });
    if (r.ok()) ctx.Moved(static_cast<std::int64_t>(size));
    return r;
  }

  // A parallel composite upload: the file goes up as parts NAME.part-KK in
  // parallel (each on a transfer slot), then one `compose` makes NAME of them
  // (checked against the crc32c of the whole, combined from the parts'), and
  // the parts are deleted. Composite objects have a crc32c but no MD5. Parts
  // a crash leaves behind are named after NAME, so whoever collects NAME's
  // garbage collects them too.
  StatusOr<ObjectInfo> Composite(const std::string& name, const std::string& path, std::uint64_t size,
                                 const Precondition& pre, const CallContext& ctx) {
    const std::uint64_t part = PartBytes(size);
    const std::size_t n = PartCount(size);
    std::vector<StatusOr<ObjectInfo>> parts(n, StatusOr<ObjectInfo>(CancelledError("not started")));
    auto uploaded = ParallelFor(n, slots_.Capacity(ctx), [&](std::size_t i) -> Status {
      Slot slot(slots_, ctx);
      if (!slot.status().ok()) return slot.status();
      std::uint64_t off = i * part;
      parts[i] = UploadRange(PartName(name, i), path, off, static_cast<std::size_t>(std::min(part, size - off)), {},
                             /*describe=*/false, ctx);
      return parts[i].status();
    });
    auto cleanup = [&] { DeleteParts(name, parts, ctx); };
    if (!uploaded.ok()) {
      cleanup();
      return uploaded;
    }
    std::uint32_t crc = 0;
    for (std::size_t i = 0; i < n; ++i) {
      crc = i == 0 ? parts[i]->crc32c : Crc32cCombine(crc, parts[i]->crc32c, parts[i]->size);
    }
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) {
      cleanup();
      return FailedPreconditionError(path + " changed size while being uploaded");
    }
    Json sources = Json::array();
    for (auto const& p : parts) sources.push_back({{"name", FullName(p->name)}, {"generation", std::to_string(p->generation)}});
    Json body = {{"kind", "storage#composeRequest"}, {"sourceObjects", sources}, {"destination", Describe(name)}};
    // A replay after a lost answer composes the same parts again (or meets
    // 412 under a precondition, which the caller reconciles as for any write).
    auto composed = Retry(ctx, kWrite, [&]() -> StatusOr<ObjectInfo> {
      auto req = Request("POST", ObjectUrl(name) + "/compose" + Query(pre, '?'));
      req.headers = {{"Content-Type", "application/json; charset=UTF-8"}};
      req.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
      auto r = Perform(std::move(req), ctx);
      if (!r.ok()) return r.status();
      if (r->status != 200) return HttpError(*r, "composing " + Url(name) + " of its parts", BucketUrl());
      return Verified(*r, name, crc);
    });
    cleanup();
    return composed;
  }

  std::string PartName(const std::string& name, std::size_t i) const { return fmt::format("{}.part-{:02}", name, i); }

  // Best effort, in parallel: a part left behind costs storage, not safety.
  void DeleteParts(const std::string& name, const std::vector<StatusOr<ObjectInfo>>& parts, const CallContext& ctx) {
    ParallelFor(parts.size(), slots_.Capacity(ctx), [&](std::size_t i) -> Status {
      if (parts[i].ok()) {
        (void)Perform(Request("DELETE", ObjectUrl(PartName(name, i)) + Query(Precondition{parts[i]->generation}, '?')), ctx);
      }
      return OkStatus();
    });
  }

  // A large object comes down as byte ranges in parallel, written in place
  // into a file preallocated to its size; each range's crc32c is combined
  // in order and the whole checked against the object's. The first range
  // pins the generation, so every range reads the same object.
  StatusOr<ObjectInfo> RangedDownload(const std::string& name, const std::string& path, std::uint64_t size,
                                      const CallContext& ctx) {
    auto created = CreateForRanges(path, size);
    if (!created.ok()) return created.status();
    Fd f{*created};
    const std::uint64_t part = PartBytes(size);
    const std::size_t n = PartCount(size);
    struct Range {
      std::uint32_t crc = 0;
      std::uint64_t got = 0;
    };
    std::vector<Range> ranges(n);
    std::mutex mu, file_mu;
    std::int64_t generation = 0;  // from the first range
    std::optional<std::uint32_t> whole_crc;
    auto fetch = [&](std::size_t i) -> Status {
      std::uint64_t first = i * part, last = std::min(size, first + part) - 1;
      Slot slot(slots_, ctx);
      if (!slot.status().ok()) return slot.status();
      std::uint64_t counted = 0;
      return Retry(ctx, Idempotency::kIdempotent, [&]() -> Status {
        ctx.Moved(-static_cast<std::int64_t>(counted));
        counted = 0;
        std::string url = ObjectUrl(name) + "?alt=media";
        {
          std::lock_guard lk(mu);
          if (generation != 0) url += fmt::format("&generation={}", generation);
        }
        HttpRequest req = Request("GET", url);
        req.headers = {{"Range", fmt::format("bytes={}-{}", first, last)}};
        req.timeout = std::chrono::hours(24);  // bounded by low_speed_limit instead
        req.low_speed_limit = 1024;
        const std::string where = Url(name);
        RangeWriter r{f.fd, first, last - first + 1, path, where, ctx, counted, &file_mu};
        req.on_body = [&r](std::string_view chunk) { return r.Feed(chunk); };
        auto resp = Send(req, ctx);
        if (!r.error.ok()) return r.error;
        if (!resp.ok()) return resp.status();
        if (resp->status != 206) {
          if (resp->status == 200) {
            return UnavailableError(fmt::format("downloading {}: the server ignored the byte range", Url(name)));
          }
          if (resp->status == 404) {
            std::int64_t pinned = 0;
            std::optional<std::uint32_t> crc;
            {
              std::lock_guard lk(mu);
              pinned = generation;
              crc = whole_crc;
            }
            if (pinned != 0) return Repin(name, pinned, size, crc, generation, mu, ctx);
          }
          return HttpError(*resp, "downloading " + Url(name), BucketUrl());
        }
        auto total = ParseContentRangeTotal(resp->Header("content-range"));
        if (!total || *total != size) {
          return FailedPreconditionError(fmt::format(
              "downloading {}: the object is not the {} bytes the manifest names (Content-Range \"{}\")", Url(name), size,
              output::EscapeInvalidUtf8(resp->Header("content-range").substr(0, 100))));
        }
        if (r.got != last - first + 1) return UnavailableError(fmt::format("downloading {}: a range came back short", Url(name)));
        auto server = HeaderCrc32c(*resp);
        std::lock_guard lk(mu);
        if (generation == 0) generation = HeaderGeneration(*resp);
        if (server) whole_crc = *server;
        ranges[i] = Range{r.crc, r.got};
        return OkStatus();
      });
    };
    // The first range alone, to pin the generation; then the rest at once.
    if (auto st = fetch(0); !st.ok()) return st;
    if (auto st = ParallelFor(n - 1, slots_.Capacity(ctx), [&](std::size_t k) { return fetch(k + 1); }); !st.ok()) {
      return st;
    }
    std::uint32_t crc = 0;
    for (std::size_t i = 0; i < n; ++i) {
      crc = i == 0 ? ranges[i].crc : Crc32cCombine(crc, ranges[i].crc, ranges[i].got);
    }
    if (whole_crc && *whole_crc != crc) {
      return UnavailableError(fmt::format("downloading {}: crc32c mismatch (got {}, server says {}): corrupted in transit",
                                          Url(name), Crc32cToBase64(crc), Crc32cToBase64(*whole_crc)));
    }
    if (fsync(f.fd) != 0) return ErrnoToStatus(errno, "flushing " + path);
    return ObjectInfo{name, generation, size, crc};
  }

  // A pinned generation is gone mid-download: the object was written again
  // (a rewrite, a storage-class change, a copy over itself). With the same
  // bytes (size and crc32c) the ranges already here stay good: the live
  // generation is pinned instead and the range asked again (Unavailable, so
  // the retry policy repeats it). Else it was replaced: said so, never mixed.
  Status Repin(const std::string& name, std::int64_t pinned, std::uint64_t size, std::optional<std::uint32_t> crc,
               std::int64_t& generation, std::mutex& mu, const CallContext& ctx) {
    // Its generation from the live object: only the same bytes are pinned again.
    auto r = Perform(Request("GET", ObjectUrl(name)), ctx);
    if (!r.ok()) return r.status();
    if (r->status == 404) {
      return FailedPreconditionError(fmt::format(
          "downloading {}: the object was deleted during the restore (generation {} is gone)", Url(name), pinned));
    }
    if (r->status != 200) return HttpError(*r, "looking up " + Url(name), BucketUrl());
    auto live = ParseObject(r->body, o_.prefix);
    if (!live.ok()) return live.status();
    if (live->size != size || !crc || live->crc32c != *crc) {
      return FailedPreconditionError(fmt::format(
          "downloading {}: the object was replaced during the restore (generation {} is now {}, with other bytes: "
          "{} bytes, crc32c {}): not mixing the two",
          Url(name), pinned, live->generation, live->size, Crc32cToBase64(live->crc32c)));
    }
    std::lock_guard lk(mu);
    if (generation == pinned) generation = live->generation;
    return UnavailableError(fmt::format("downloading {}: generation {} was rewritten as {} with the same bytes: "
                                        "asking the range again from it",
                                        Url(name), pinned, live->generation));
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
  TransferSlots slots_;
  HttpPool http_;
  CancellableSleeper default_sleeper_;
  StoreRetry retry_;
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
