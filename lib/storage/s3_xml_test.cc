#include "storage/s3_xml.h"

#include <catch2/catch.hpp>

#include "log/logger.h"
#include "storage/aws_credentials.h"
#include "storage/object_store.h"

namespace spotvisor {
namespace {

TEST_CASE("ParseListObjectsV2 reads keys (URL-decoded), ETags, sizes and the continuation token", "[s3]") {
  std::string xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>run%2F</Prefix>
<KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>
<Contents><Key>run/checkpoints/a+b%2Bc%C3%A9~1.x</Key><LastModified>2026-11-25T00:00:00.000Z</LastModified>
<ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass></Contents>
<Contents><Key>run/manifest.json</Key><ETag>"d41d8cd98f00b204e9800998ecf8427e-3"</ETag><Size>0</Size></Contents>
<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken></ListBucketResult>)";
  auto page = ParseListObjectsV2(xml);
  REQUIRE(page.ok());
  REQUIRE(page->items.size() == 2);
  CHECK(page->items[0].key == "run/checkpoints/a b+c\xC3\xA9~1.x");
  CHECK(page->items[0].etag == "9b2cf535f27731c974343645a3985328");
  CHECK(page->items[0].size == 12);
  CHECK(page->items[1].etag == "d41d8cd98f00b204e9800998ecf8427e-3");
  CHECK(page->next_token == "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
}

TEST_CASE("ParseListObjectsV2 refuses what is not a listing, without throwing", "[s3]") {
  CHECK(!ParseListObjectsV2("").ok());
  CHECK(!ParseListObjectsV2("<Error><Code>AccessDenied</Code></Error>").ok());
  CHECK(!ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>x</Size></Contents>").ok());
  CHECK(!ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>1</Size>").ok());
  CHECK(!ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>").ok());
  auto last = ParseListObjectsV2("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  REQUIRE(last.ok());
  CHECK(last->items.empty());
  CHECK(last->next_token.empty());
}

TEST_CASE("XmlText decodes entities and keeps what it cannot", "[s3]") {
  CHECK(XmlText("<a>x&amp;y&lt;&#233;&#x41;&bogus;&</a>", "a") == "x&y<\xC3\xA9" "A&bogus;&");
  CHECK(!XmlText("<a>open", "a"));
  CHECK(!XmlText("", "a"));
  CHECK(XmlText("<a>&#99999999;</a>", "a") == "&#99999999;");
  CHECK(XmlEscape("<\"&>") == "&lt;&quot;&amp;&gt;");
  CHECK(PercentDecode("%zz%4") == "%zz%4");
}

TEST_CASE("S3GenerationOf: quotes ignored, never 0, different ETags differ", "[s3]") {
  CHECK(S3GenerationOf("\"abc\"") == S3GenerationOf("abc"));
  CHECK(S3GenerationOf("abc") != S3GenerationOf("abd"));
  CHECK(S3GenerationOf("abc") > 0);
  CHECK(S3GenerationOf("") > 0);
}

TEST_CASE("ParseRoleCredentials reads the instance role's keys and checks every field", "[s3]") {
  WallTime exp{};
  auto c = ParseRoleCredentials(R"({"Code":"Success","LastUpdated":"2026-11-25T00:00:00Z","Type":"AWS-HMAC",
    "AccessKeyId":"ASIAEXAMPLE","SecretAccessKey":"s3cr3t/+x","Token":"tok==","Expiration":"2026-11-25T06:00:00Z"})", &exp);
  REQUIRE(c.ok());
  CHECK(c->access_key_id == "ASIAEXAMPLE");
  CHECK(c->secret_access_key == "s3cr3t/+x");
  CHECK(c->session_token == "tok==");
  CHECK(exp == *ParseRfc3339("2026-11-25T06:00:00Z"));
  CHECK(!ParseRoleCredentials("[]", nullptr).ok());
  CHECK(!ParseRoleCredentials(R"({"Code":"Failure"})", nullptr).ok());
  CHECK(!ParseRoleCredentials(R"({"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"soon"})", nullptr).ok());
  auto bad = ParseRoleCredentials(R"({"AccessKeyId":"A\r\nX: y","SecretAccessKey":"S","Expiration":"2026-11-25T06:00:00Z"})", nullptr);
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("X: y") == std::string::npos);
}

TEST_CASE("s3:// locations parse like gs:// ones, with S3's bucket-name rules", "[s3]") {
  auto loc = ParseStoreLocation("s3://my-bucket/runs/a/");
  REQUIRE(loc.ok());
  CHECK(loc->scheme == "s3");
  CHECK(loc->bucket == "my-bucket");
  CHECK(loc->prefix == "runs/a");
  CHECK(!ParseStoreLocation("s3://my_bucket").ok());  // '_' is Cloud Storage only
  CHECK(ParseStoreLocation("gs://my_bucket").ok());
  CHECK(!ParseStoreLocation("s3://" + std::string(64, 'a')).ok());
  CHECK(ParseStoreLocation("s3://ab").status().message().find("s3://BUCKET") == std::string::npos);
}

TEST_CASE("a prefix with an empty, . or .. segment is refused, naming the right form", "[s3]") {
  for (auto bad : {"gs://bucket//x", "gs://bucket/a//b", "s3://bucket/./x", "gs://bucket/a/../b"}) {
    INFO(bad);
    auto loc = ParseStoreLocation(bad);
    REQUIRE_FALSE(loc.ok());
    CHECK(loc.status().message().find("segment") != std::string::npos);
  }
  CHECK(ParseStoreLocation("gs://bucket//x").status().message().find("gs://bucket/A/B") != std::string::npos);
  CHECK(ParseStoreLocation("gs://bucket/a/b/").value().prefix == "a/b");
}

}  // namespace
}  // namespace spotvisor
