"""What a person reads: a typical run's log lines, in both formats.

A typical run is one VM of a run with periodic syncs to (fake) Cloud Storage
that is preempted, then a second VM that restores and completes it. Its JSON
lines must name each fact once with numbers rounded; its text lines (what a
terminal shows) must fit TERMINAL columns, leaving out what the message
already says, with sizes in one style.
"""
import json
import math
import os
import re
import unittest

from harness import FAKE_TRAINER, ROOT, SpotvisorTestCase, wait_until

# A laptop's terminal full screen at a normal font (180 columns), with the
# user's paths as short as a user's would be: the message says them, and
# they are the user's to choose. Most lines are far shorter (MEDIAN).
TERMINAL = 180
MEDIAN = 120
ENVELOPE = {"severity", "logging.googleapis.com/severity", "message", "time", "event", "logging.googleapis.com/labels"}


def rounded(v):
    """What spotvisor writes for a float: 3 decimals, or 3 significant digits below 1."""
    if v == 0 or not math.isfinite(v) or abs(v) >= 1e15:
        return v
    decimals = max(3, 2 - math.floor(math.log10(abs(v))))
    return round(v, decimals)


class TypicalRunLogTest(SpotvisorTestCase):
    def typical_run(self, log_format):
        """Both boots' stdout lines, in order."""
        from fake_gcs import FakeGcsServer
        gcs = FakeGcsServer(buckets=["ckpt-bucket"]).start()
        self.addCleanup(gcs.stop)
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{gcs.port}"}
        sets = {"bucket": "gs://ckpt-bucket/exp", "run-id": "mnist-1", "sync-interval": "500ms", "sync-settle": "0s",
                "log-format": log_format}
        first = self.run_trainer(["--checkpoint-every", "50"], sets=sets, env=env)
        # Waits on raw lines: in text format there are no JSON events to parse.
        wait_until(lambda: any("fake_trainer started" in line for line in first.raw), what="the trainer's start")
        wait_until(lambda: any("sync.complete" in line and "periodic" in line for line in first.raw), what="a periodic sync")
        self.wait_parked()
        self.metadata.set("instance/preempted", "TRUE")
        self.assertEqual(first.wait_exit(), 130)
        self.metadata.set("instance/preempted", "FALSE")
        sets["checkpoint-dir"] = self.path("ckpt2")
        second = self.run_trainer(["--run-for", "2"], sets=sets, env=env)
        self.assertEqual(second.wait_exit(60), 0)
        return first.raw + second.raw

    def test_json_lines_name_each_fact_once_with_rounded_numbers(self):
        lines = self.typical_run("json")
        events = [json.loads(line) for line in lines]
        names = {e["event"] for e in events}
        for needed in ("run.start", "supervisor.state", "sync.complete", "restore.complete", "trainer.exit", "run.end"):
            self.assertIn(needed, names)
        for e in events:
            fields = {k: v for k, v in e.items() if k not in ENVELOPE}
            seen = {}
            for k, v in fields.items():
                # Two fields holding the same text (or the same list) say one fact twice,
                # as supervisor.state's from/from_state and to/state did.
                if isinstance(v, str) and len(v) >= 2 or isinstance(v, (list, dict)) and v:
                    key = json.dumps(v, sort_keys=True)
                    self.assertNotIn(key, seen, f"{e['event']}: {k} repeats {seen.get(key)}: {e}")
                    seen[key] = k
                if isinstance(v, float):
                    self.assertEqual(v, rounded(v), f"{e['event']}.{k} is not rounded: {v}")
        states = [e for e in events if e["event"] == "supervisor.state"]
        self.assertIn(("running", "stopping/SIGINT"), [(e["from"], e["to"]) for e in states])

    def test_text_lines_fit_a_terminal_with_one_size_style(self):
        # The user's own paths (this test's temp dir, the trainer's path) are
        # theirs to choose: measured as the short paths a user would have.
        lines = [line.rstrip("\n").replace(self.tmp, "/tmp/r").replace(FAKE_TRAINER, "train.py").replace(ROOT, "/home/u")
                 for line in self.typical_run("text")]
        ours = [line for line in lines if not re.match(r"^\S+ (stdout|stderr) *\| ", line)]
        self.assertGreater(len(ours), 25, "\n".join(lines))
        for needed in ("supervisor.state", "sync.complete", "restore.complete", "run.end"):
            self.assertTrue(any(needed in line for line in ours), needed)
        too_wide = [line for line in ours if len(line) > TERMINAL]
        self.assertEqual(too_wide, [], f"lines over {TERMINAL} columns:\n" + "\n".join(too_wide))
        text = "\n".join(ours)
        # The message says the states; a key=value pair would only say them again.
        self.assertNotRegex(text, r"supervisor\.state .*(from|to|from_state|state|why)=")
        # One size style: decimal units with one decimal, never a long byte count or binary units.
        self.assertNotRegex(text, r"\b\d{4,} bytes|MiB|GiB")
        # No float of 17 digits: every number in a key=value pair is rounded.
        numbers = re.findall(r"  \w+=(-?\d+\.\d+)\b", text)
        self.assertTrue(numbers, "some float fields")
        for number in numbers:
            self.assertEqual(float(number), rounded(float(number)), number)
        widths = sorted(len(line) for line in ours)
        self.assertLessEqual(widths[len(widths) // 2], MEDIAN, "the median line")
        print(f"\n{len(ours)} lines: median {widths[len(widths) // 2]}, widest {widths[-1]} columns")


if __name__ == "__main__":
    unittest.main()
