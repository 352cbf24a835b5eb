#include "storage/s3_xml.h"

#include <cstdlib>

#include <fmt/format.h>

#include "common/strings.h"
#include "output/utf8.h"

namespace spotvisor {

// The text of the first <TAG>...</TAG> in `xml` (from `from`), entities
// decoded; nullopt when absent. S3's answers are flat enough for this, and
// nothing here trusts their shape.
std::optional<std::string> XmlText(std::string_view xml, std::string_view tag, std::size_t from) {
  std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  auto a = xml.find(open, from);
  if (a == std::string_view::npos) return std::nullopt;
  a += open.size();
  auto b = xml.find(close, a);
  if (b == std::string_view::npos) return std::nullopt;
  std::string_view raw = xml.substr(a, b - a);
  std::string out;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    auto semi = raw.find(';', i);
    if (semi == std::string_view::npos || semi - i > 10) {
      out += '&';
      continue;
    }
    std::string_view ent = raw.substr(i + 1, semi - i - 1);
    std::optional<unsigned long> code;
    if (ent == "amp") code = '&';
    else if (ent == "lt") code = '<';
    else if (ent == "gt") code = '>';
    else if (ent == "quot") code = '"';
    else if (ent == "apos") code = '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      bool hex = ent[1] == 'x' || ent[1] == 'X';
      std::string digits(ent.substr(hex ? 2 : 1));
      char* end = nullptr;
      unsigned long v = digits.empty() ? 0 : std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      if (!digits.empty() && end && *end == '\0' && v < 0x110000) code = v;
    }
    if (!code) {
      out += '&';
      continue;
    }
    unsigned long c = *code;  // as UTF-8
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
    i = semi;
  }
  return out;
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Percent-decoding of encoding-type=url keys; a malformed escape is kept.
std::string PercentDecode(std::string_view s) {
  std::string out;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else if (s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string Unquote(std::string_view etag) {
  etag = Trim(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

std::int64_t S3GenerationOf(std::string_view etag) {
  std::string e = Unquote(etag);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : e) {
    h ^= c;
    h *= 1099511628211ull;
  }
  auto g = static_cast<std::int64_t>(h & 0x7fffffffffffffffull);
  return g == 0 ? 1 : g;
}

StatusOr<S3ListPage> ParseListObjectsV2(std::string_view xml) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    return UnavailableError("ListObjectsV2: not a ListBucketResult: " + output::EscapeInvalidUtf8(std::string(xml.substr(0, 200))));
  }
  S3ListPage page;
  std::size_t at = 0;
  for (;;) {
    auto a = xml.find("<Contents>", at);
    if (a == std::string_view::npos) break;
    auto b = xml.find("</Contents>", a);
    if (b == std::string_view::npos) return UnavailableError("ListObjectsV2: truncated <Contents>");
    std::string_view block = xml.substr(a, b - a);
    at = b;
    auto key = XmlText(block, "Key");
    auto size = XmlText(block, "Size");
    auto parsed = size ? ParseUint64(Trim(*size)) : std::nullopt;
    if (!key || !parsed) return UnavailableError("ListObjectsV2: an entry without Key or Size");
    page.items.push_back({PercentDecode(*key), Unquote(XmlText(block, "ETag").value_or("")), *parsed});
  }
  // Only what follows the last entry describes the page.
  std::string_view tail = xml.substr(at);
  bool truncated = Trim(XmlText(xml, "IsTruncated").value_or("false")) == "true";
  if (truncated) {
    page.next_token = XmlText(tail, "NextContinuationToken").value_or(XmlText(xml, "NextContinuationToken").value_or(""));
    if (page.next_token.empty()) return UnavailableError("ListObjectsV2: truncated without NextContinuationToken");
  }
  return page;
}

}  // namespace spotvisor
