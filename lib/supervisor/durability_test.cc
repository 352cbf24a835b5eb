#include "supervisor/durability.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

const SteadyTime t0 = SteadyTime{} + 1000h;
const WallTime w0 = *ParseRfc3339("2026-11-24T10:00:00Z");

TEST_CASE("RFC 3339 times: what we write reads back, anything else is refused, never thrown on") {
  auto t = WallTime(std::chrono::duration_cast<WallTime::duration>(std::chrono::nanoseconds(1'790'000'000'123'456'789)));
  CHECK(ParseRfc3339(FormatRfc3339(t)) == t);
  CHECK(ParseRfc3339("2026-11-24T10:00:00Z") == ParseRfc3339("2026-11-24T11:30:00+01:30"));
  CHECK(ParseRfc3339("2026-11-24T10:00:00.5Z").value() - *ParseRfc3339("2026-11-24T10:00:00Z") == 500ms);
  CHECK(ParseRfc3339("2026-11-24T10:00:00-02:00").value() - *ParseRfc3339("2026-11-24T10:00:00Z") == 2h);
  for (const char* bad : {"", "2026-11-24", "2026-11-24T10:00:00", "2026-13-24T10:00:00Z", "2026-11-24T25:00:00Z",
                          "2026-11-24T10:00:00.Z", "2026-11-24T10:00:00Zjunk", "2026-11-24T10:00:00+0100",
                          "abcd-11-24T10:00:00Z", "2026-11-24T10:00:00+99:00", "1969-12-31T23:59:59Z",
                          "4052-11-25T10:00:00.123456789+01:30", "9999-12-31T23:59:59Z"}) {
    CAPTURE(bad);
    CHECK_FALSE(ParseRfc3339(bad).has_value());
  }
}

TEST_CASE("a stall is a WARNING once the bucket lags sync-alert-after, an ERROR at twice, each once") {
  DurabilityTracker d(30min);
  CHECK_FALSE(d.NextCheck());  // nothing restored yet: no clock to run
  CHECK_FALSE(d.CaughtUp(t0, w0, t0));
  REQUIRE(d.NextCheck() == t0 + 30min);
  CHECK_FALSE(d.Check(t0 + 29min, std::nullopt));
  d.Problem("the last sync (periodic) failed: 403 Forbidden (storage.objects.create)");
  auto warn = d.Check(t0 + 30min, UncommittedView{3, 2'500'000'000});
  REQUIRE(warn);
  CHECK(warn->severity == Severity::kWarning);
  CHECK(warn->event == "sync.stalled");
  CHECK(warn->fields["cause"] == "the last sync (periodic) failed: 403 Forbidden (storage.objects.create)");
  CHECK(warn->fields["uncommitted_bytes"] == 2'500'000'000u);
  CHECK(warn->message.find("2.5 GB in 3 file(s) on disk are not in the bucket") != std::string::npos);
  CHECK(warn->message.find("403 Forbidden") != std::string::npos);
  CHECK(d.level() == 1);
  CHECK_FALSE(d.Check(t0 + 40min, std::nullopt));  // said once
  REQUIRE(d.NextCheck() == t0 + 60min);
  auto err = d.Check(t0 + 60min, std::nullopt);
  REQUIRE(err);
  CHECK(err->severity == Severity::kError);
  CHECK(d.level() == 2);
  CHECK_FALSE(d.NextCheck());
  CHECK(d.Json(t0 + 61min, w0 + 61min, {}, std::nullopt, std::nullopt)["stalled"] == true);

  // Caught up again: one sync.recovered, and the clock starts over.
  auto rec = d.CaughtUp(t0 + 62min, w0 + 62min, t0 + 62min);
  REQUIRE(rec);
  CHECK(rec->event == "sync.recovered");
  CHECK(d.level() == 0);
  CHECK(d.NextCheck() == t0 + 92min);
  CHECK_FALSE(d.CaughtUp(t0 + 63min, w0 + 63min, t0 + 63min));  // nothing to recover from
  // A sync whose snapshot is older than the last catch-up does not set the clock back.
  d.CaughtUp(t0 + 50min, w0 + 50min, t0 + 50min);
  CHECK(d.NextCheck() == t0 + 93min);
}

TEST_CASE("a lag already twice the limit is an ERROR at once") {
  DurabilityTracker d(1min);
  d.CaughtUp(t0, w0, t0);
  auto e = d.Check(t0 + 5min, std::nullopt);
  REQUIRE(e);
  CHECK(e->severity == Severity::kError);
  CHECK(d.level() == 2);
}

TEST_CASE("sync-alert-after 0: never stalled") {
  DurabilityTracker d(0ms);
  d.CaughtUp(t0, w0, t0);
  CHECK_FALSE(d.NextCheck());
  CHECK_FALSE(d.Check(t0 + 1000h, std::nullopt));
}

TEST_CASE("the stall names a sync that has been running too long, else the last problem") {
  DurabilityTracker d(10min);
  d.CaughtUp(t0, w0, t0);
  d.Problem("the last sync (periodic) committed nothing: a file is open for writing");
  d.SyncInFlight(t0 + 2min);
  auto e = d.Check(t0 + 10min, std::nullopt);
  REQUIRE(e);
  CHECK(d.cause().find("a sync has been running for 8m") != std::string::npos);
  DurabilityTracker d2(10min);
  d2.CaughtUp(t0, w0, t0);
  d2.Problem("the last sync (periodic) committed nothing: a file is open for writing");
  d2.SyncInFlight(t0 + 9min);
  REQUIRE(d2.Check(t0 + 10min, std::nullopt));
  CHECK(d2.cause() == "the last sync (periodic) committed nothing: a file is open for writing");
  DurabilityTracker d3(10min);
  d3.CaughtUp(t0, w0, t0);
  REQUIRE(d3.Check(t0 + 10min, std::nullopt));
  CHECK(d3.cause().find("no sync has caught up") != std::string::npos);
  // A short sync-alert-after: a sync younger than the progress window is
  // running, not "moving nothing in the last 15s".
  DurabilityTracker d4(3s);
  d4.CaughtUp(t0, w0, t0);
  d4.SyncInFlight(t0 + 1100ms);
  REQUIRE(d4.Check(t0 + 3s, std::nullopt));
  CHECK(d4.cause() == "a sync is running (for 1.9s)");
  REQUIRE(d4.Check(t0 + 16100ms, std::nullopt));  // ERROR at twice the limit, the sync 15 s old
  CHECK(d4.cause().find("a sync has been running for 15s and has moved nothing in the last 15s") == 0);
}

// Issue #32: a 1.5 GiB upload at 40 MB/s with sync-interval 5s paged people:
// WARNING, then ERROR while the bytes were moving, then recovered and ERROR
// again 1 ms later.
TEST_CASE("a sync that keeps moving bytes is not stalled, however old the commit; once it stops, it is") {
  DurabilityTracker d(15s);
  d.CaughtUp(t0, w0, t0);
  d.SyncInFlight(t0 + 1s);
  std::uint64_t bytes = 0;
  for (auto t = t0 + 5s; t <= t0 + 60s; t += 5s) {
    bytes += 200'000'000;  // 40 MB/s
    d.Progress(t, bytes);
    CHECK_FALSE(d.Check(t, std::nullopt));
    CHECK_FALSE(d.Check(t + 4s, std::nullopt));
  }
  CHECK(d.level() == 0);
  REQUIRE(d.NextCheck() == t0 + 60s + 15s);  // when it could have stopped
  // It stops moving: a progress report with nothing new.
  d.Progress(t0 + 65s, bytes);
  CHECK_FALSE(d.Check(t0 + 70s, std::nullopt));
  auto e = d.Check(t0 + 75s, std::nullopt);
  REQUIRE(e);
  CHECK(e->severity == Severity::kError);  // the lag is long past twice the limit
  CHECK(d.cause().find("a sync has been running for 1m14s") != std::string::npos);
}

TEST_CASE("a sync moving less than 100 kB/s is not moving") {
  DurabilityTracker d(15s);
  d.CaughtUp(t0, w0, t0);
  d.SyncInFlight(t0);
  d.Progress(t0 + 5s, 10'000);
  d.Progress(t0 + 10s, 20'000);
  REQUIRE(d.Check(t0 + 15s, std::nullopt));
  CHECK(d.level() == 1);
}

TEST_CASE("no stall is said within sync-alert-after of a catch-up, though the caught-up point is older") {
  DurabilityTracker d(15s);
  d.CaughtUp(t0, w0, t0);
  REQUIRE(d.Check(t0 + 30s, std::nullopt));  // ERROR: nothing in flight
  // A long upload commits: the bucket holds the tree as of its start, 35 s ago.
  auto rec = d.CaughtUp(t0 + 20s, w0 + 20s, t0 + 55s);
  REQUIRE(rec);
  CHECK(rec->event == "sync.recovered");
  CHECK(d.NextCheck() == t0 + 70s);
  CHECK_FALSE(d.Check(t0 + 55s + 1ms, std::nullopt));
  CHECK_FALSE(d.Check(t0 + 69s, std::nullopt));
  REQUIRE(d.Check(t0 + 70s, std::nullopt));  // then, with no sync moving, it is said
  // Also with nothing to recover from: a commit whose snapshot is 20 s old.
  DurabilityTracker d2(15s);
  d2.CaughtUp(t0, w0, t0);
  CHECK_FALSE(d2.CaughtUp(t0 + 5s, w0 + 5s, t0 + 25s));
  CHECK(d2.NextCheck() == t0 + 40s);
  CHECK_FALSE(d2.Check(t0 + 25s + 1ms, std::nullopt));
}

TEST_CASE("the durability block: the commit's age from its own time, never negative, what is at risk") {
  DurabilityTracker d(30min);
  d.CaughtUp(t0, w0, t0);
  CommittedView c;
  c.known = true;
  c.sequence = 7;
  c.committed_at = "2026-11-24T09:55:00Z";
  c.committed_time = ParseRfc3339(c.committed_at);
  c.instance = "vm-a";
  c.files = 2;
  c.bytes = 300;
  auto j = d.Json(t0 + 1min, w0 + 1min, c, UncommittedView{1, 50}, w0 + 30s);
  CHECK(j["sequence"] == 7);
  CHECK(j["age_s"].get<double>() == Approx(360.0));
  CHECK(j["lag_s"].get<double>() == Approx(60.0));
  CHECK(j["caught_up_at"] == "2026-11-24T10:00:00.000000000Z");
  CHECK(j["uncommitted_files"] == 1);
  CHECK(j["uncommitted_bytes"] == 50);
  CHECK(j["uncommitted_as_of"] == "2026-11-24T10:00:30.000000000Z");
  CHECK(j["instance"] == "vm-a");
  CHECK(j["stalled"] == false);
  // Committed by a VM whose clock runs ahead.
  c.committed_time = w0 + 10min;
  CHECK(d.Json(t0, w0, c, std::nullopt, std::nullopt)["age_s"] == 0.0);
  // A manifest time that is not a time: no age, and the event says so.
  c.committed_time.reset();
  c.committed_at = "yesterday";
  CHECK(d.Json(t0, w0, c, std::nullopt, std::nullopt)["age_s"].is_null());
  CHECK(d.AgeEvent(t0, w0, c, std::nullopt).message.find("not readable") != std::string::npos);
  // Nothing committed yet.
  auto none = d.AgeEvent(t0 + 1min, w0 + 1min, CommittedView{}, UncommittedView{2, 10});
  CHECK(none.event == "checkpoint.age");
  CHECK(none.message == "no checkpoint committed yet; 10 bytes in 2 file(s) not committed yet; the bucket last caught up 1m ago");
  CHECK(none.fields["committed_at"].is_null());
}

}  // namespace
}  // namespace spotvisor
