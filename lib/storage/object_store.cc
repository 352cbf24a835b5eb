#include "storage/object_store.h"

#include <fmt/format.h>

#include "common/strings.h"

namespace spotvisor {

StatusOr<StoreLocation> ParseStoreLocation(const std::string& url) {
  StoreLocation loc;
  if (StartsWith(url, "gs://") || StartsWith(url, "s3://")) {
    std::string rest = url.substr(5);
    auto slash = rest.find('/');
    loc.scheme = url.substr(0, 2);
    loc.bucket = rest.substr(0, slash);
    if (slash != std::string::npos) loc.prefix = rest.substr(slash + 1);
    while (!loc.prefix.empty() && loc.prefix.back() == '/') loc.prefix.pop_back();
    // Cloud Storage bucket names: 3-63 (or up to 222 with dots) of a-z 0-9
    // - _ . ; S3's: 3-63 of a-z 0-9 - . (no '_').
    bool s3 = loc.scheme == "s3";
    bool ok = loc.bucket.size() >= 3 && loc.bucket.size() <= (s3 ? 63u : 222u);
    for (char c : loc.bucket) {
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (c == '_' && !s3) || c == '.');
    }
    if (!ok) return InvalidArgumentError(fmt::format("\"{}\" is not a valid bucket name", loc.bucket));
    // gs://bucket//x named objects "/x/..." (issue #32): every segment of
    // the prefix is a name.
    if (!loc.prefix.empty()) {
      for (auto const& seg : SplitOn(loc.prefix, '/')) {
        if (seg.empty() || seg == "." || seg == "..") {
          return InvalidArgumentError(fmt::format(
              "\"{}\": the prefix \"{}\" has an empty, \".\" or \"..\" segment (write {}://{}/A/B)", url, loc.prefix,
              loc.scheme, loc.bucket));
        }
      }
    }
    return loc;
  }
  if (StartsWith(url, "file:///")) {
    loc.scheme = "file";
    loc.prefix = url.substr(7);
    while (loc.prefix.size() > 1 && loc.prefix.back() == '/') loc.prefix.pop_back();
    return loc;
  }
  return InvalidArgumentError(fmt::format("\"{}\" is not gs://BUCKET[/PREFIX], s3://BUCKET[/PREFIX] or file:///PATH", url));
}

}  // namespace spotvisor
