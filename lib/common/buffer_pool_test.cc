#include "common/buffer_pool.h"

#include <catch2/catch.hpp>

#include "http/http_client.h"

namespace spotvisor {
namespace {

TEST_CASE("a buffer given back is taken again with its capacity, empty") {
  BufferPool pool;
  std::string b = pool.Take();
  CHECK(b.capacity() < 4096);
  b.resize(16 << 20);
  const char* where = b.data();
  pool.Give(std::move(b));
  CHECK(pool.kept() == 1);
  std::string again = pool.Take();
  CHECK(again.empty());
  CHECK(again.capacity() >= (16u << 20));
  CHECK(again.data() == where);  // the same memory: no fresh pages to fault in
  CHECK(pool.kept() == 0);
}

TEST_CASE("the largest kept buffer is taken first; small ones are not kept") {
  BufferPool pool;
  std::string small(100, 'x'), mid(1 << 20, 'x'), big(8 << 20, 'x');
  pool.Give(std::move(small));
  CHECK(pool.kept() == 0);
  pool.Give(std::move(mid));
  pool.Give(std::move(big));
  CHECK(pool.Take().capacity() >= (8u << 20));
  CHECK(pool.Take().capacity() >= (1u << 20));
}

TEST_CASE("the pool keeps a bounded number and Clear frees them all") {
  BufferPool pool;
  for (std::size_t i = 0; i < BufferPool::kMaxKept + 10; ++i) pool.Give(std::string(8192, 'x'));
  CHECK(pool.kept() == BufferPool::kMaxKept);
  CHECK(pool.Clear() >= BufferPool::kMaxKept * 8192);
  CHECK(pool.kept() == 0);
  CHECK(pool.Clear() == 0);
}

TEST_CASE("a PooledBuffer goes back to its pool at the end of its scope") {
  BufferPool pool;
  {
    PooledBuffer buf(pool);
    buf->assign(1 << 20, 'a');
  }
  CHECK(pool.kept() == 1);
}

TEST_CASE("a request's borrowed body is sent instead of its own") {
  HttpRequest req;
  req.body = "own";
  CHECK(req.Body() == "own");
  std::string part(10, 'p');
  req.borrowed_body = part;
  CHECK(req.Body().data() == part.data());  // not a copy
  req.borrowed_body = std::string_view("", 0);
  CHECK(req.Body().empty());  // an empty borrowed body is still the body
}

}  // namespace
}  // namespace spotvisor
