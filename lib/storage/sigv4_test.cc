#include "storage/sigv4.h"

#include <catch2/catch.hpp>

#include "log/logger.h"

namespace spotvisor {
namespace {

std::string HeaderOf(const HttpRequest& r, const std::string& name) {
  for (auto const& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

// AWS's own examples ("Examples: Signature Calculations in AWS Signature
// Version 4", Amazon S3 API reference), with the example account's keys.
const AwsCredentials kExample{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
WallTime ExampleTime() { return *ParseRfc3339("2013-05-24T00:00:00Z"); }
const std::string kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST_CASE("SigV4: AWS's GET Object example (a Range header)", "[sigv4]") {
  HttpRequest r;
  r.url = "https://examplebucket.s3.amazonaws.com/test.txt";
  r.headers = {{"Range", "bytes=0-9"}};
  REQUIRE(SignV4(r, kExample, "us-east-1", "s3", kEmpty, ExampleTime()).ok());
  CHECK(HeaderOf(r, "Authorization") ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  CHECK(HeaderOf(r, "x-amz-date") == "20130524T000000Z");
  CHECK(HeaderOf(r, "Host") == "examplebucket.s3.amazonaws.com");
}

TEST_CASE("SigV4: AWS's PUT Object example (a signed payload, an encoded key, a storage class)", "[sigv4]") {
  HttpRequest r;
  r.method = "PUT";
  r.url = "https://examplebucket.s3.amazonaws.com/" + AwsUriEncode("test$file.text", true);
  r.body = "Welcome to Amazon S3.";
  r.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  REQUIRE(SignV4(r, kExample, "us-east-1", "s3", Sha256Hex(r.body), ExampleTime()).ok());
  CHECK(HeaderOf(r, "x-amz-content-sha256") == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  CHECK(HeaderOf(r, "Authorization") ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
        "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST_CASE("SigV4: AWS's GET Bucket Lifecycle and List Objects examples (query strings)", "[sigv4]") {
  HttpRequest life;
  life.url = "https://examplebucket.s3.amazonaws.com/?lifecycle";
  REQUIRE(SignV4(life, kExample, "us-east-1", "s3", kEmpty, ExampleTime()).ok());
  CHECK(HeaderOf(life, "Authorization").ends_with(
      "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"));

  HttpRequest list;
  list.url = "https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J";
  REQUIRE(SignV4(list, kExample, "us-east-1", "s3", kEmpty, ExampleTime()).ok());
  CHECK(HeaderOf(list, "Authorization").ends_with(
      "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
}

TEST_CASE("SigV4: a session token is sent and signed, a retry is signed afresh", "[sigv4]") {
  HttpRequest r;
  r.url = "http://127.0.0.1:9000/bucket/key";
  AwsCredentials c = kExample;
  c.session_token = "TOKEN";
  REQUIRE(SignV4(r, c, "eu-west-1", "s3", kUnsignedPayload, ExampleTime()).ok());
  REQUIRE(SignV4(r, c, "eu-west-1", "s3", kUnsignedPayload, ExampleTime() + std::chrono::seconds(1)).ok());
  int auth = 0;
  for (auto const& h : r.headers) auth += h.first == "Authorization";
  CHECK(auth == 1);
  CHECK(HeaderOf(r, "x-amz-security-token") == "TOKEN");
  CHECK(HeaderOf(r, "x-amz-date") == "20130524T000001Z");
  CHECK(HeaderOf(r, "Host") == "127.0.0.1:9000");
  CHECK(HeaderOf(r, "Authorization").find("x-amz-security-token") != std::string::npos);
  CHECK(HeaderOf(r, "Authorization").find("/eu-west-1/s3/") != std::string::npos);
  CHECK(HeaderOf(r, "Authorization").find(c.secret_access_key) == std::string::npos);
}

TEST_CASE("SigV4: no credentials is an error, not an unsigned request", "[sigv4]") {
  HttpRequest r;
  r.url = "https://b.s3.amazonaws.com/k";
  CHECK(SignV4(r, AwsCredentials{}, "us-east-1", "s3", kEmpty, ExampleTime()).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("AwsUriEncode keeps only the unreserved characters", "[sigv4]") {
  CHECK(AwsUriEncode("a b+c/d~e.f_g-h%é", true) == "a%20b%2Bc/d~e.f_g-h%25%C3%A9");
  CHECK(AwsUriEncode("a/b", false) == "a%2Fb");
}

}  // namespace
}  // namespace spotvisor
