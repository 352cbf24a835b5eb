// S3's XML answers: ParseListObjectsV2 and XmlText on any bytes give a page
// or an error, never a crash, a hang or a read out of bounds; a page's
// keys and tokens are what the answer held, decoded.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "storage/aws_credentials.h"
#include "storage/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view xml(reinterpret_cast<const char*>(data), size);
  auto page = spotvisor::ParseListObjectsV2(xml);
  if (page.ok()) {
    for (auto const& item : page->items) {
      if (spotvisor::S3GenerationOf(item.etag) <= 0) std::abort();
    }
  }
  for (auto tag : {"Code", "Message", "UploadId", "ETag", "Region"}) {
    auto t = spotvisor::XmlText(xml, tag);
    if (t && t->size() > xml.size()) std::abort();  // decoding never grows the text
  }
  (void)spotvisor::ParseRoleCredentials(xml, nullptr);
  return 0;
}
