#include "mount/guarded_store.h"

#include <fmt/format.h>

#include "mount/mountinfo.h"

namespace spotvisor {
namespace {

class GuardedStore final : public ObjectStore {
 public:
  GuardedStore(std::unique_ptr<ObjectStore> inner, std::function<Status()> check)
      : inner_(std::move(inner)), check_(std::move(check)) {}

  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->UploadFile(name, path, pre, ctx);
  }
  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->UploadBytes(name, data, pre, ctx);
  }
  StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->ReadBytes(name, info, ctx);
  }
  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, std::uint64_t size_hint,
                                      const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->DownloadToFile(name, path, size_hint, ctx);
  }
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->List(prefix, ctx);
  }
  Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->Delete(name, pre, ctx);
  }
  Status CheckAccess(const CallContext& ctx) override {
    if (auto s = check_(); !s.ok()) return s;
    return inner_->CheckAccess(ctx);
  }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::unique_ptr<ObjectStore> inner_;
  std::function<Status()> check_;
};

}  // namespace

std::unique_ptr<ObjectStore> GuardByMount(std::unique_ptr<ObjectStore> inner, std::function<Status()> check) {
  return std::make_unique<GuardedStore>(std::move(inner), std::move(check));
}

Status CheckFuseMounted(const std::string& dir) {
  auto table = ReadMountInfo();
  if (!table.ok()) return table.status();
  auto e = FindMountAt(*table, dir);
  if (!e || e->fstype.rfind("fuse", 0) != 0) {
    return UnavailableError(fmt::format("the bucket mount {} is not mounted any more (sync-via = mount): not writing into "
                                        "the bare directory",
                                        dir));
  }
  return OkStatus();
}

}  // namespace spotvisor
