"""The docs and --help stay true to the code."""
import json
import os
import re
import shutil
import subprocess
import unittest

from harness import ROOT, SPOTVISOR


def run(*args, env=None):
    return subprocess.run([SPOTVISOR, *args], capture_output=True, text=True, env=env)


class DocsTest(unittest.TestCase):
    def test_every_key_is_documented(self):
        out = run("config", "--json", "--config", "/nonexistent-default-ok")
        keys = json.loads(out.stdout)["keys"]
        doc = open(os.path.join(ROOT, "docs", "configuration.md")).read()
        for key in keys:
            self.assertIn(f"| `{key}` |", doc, f"key {key} missing from docs/configuration.md")
        documented = set(re.findall(r"^\| `([a-z-]+)` \|", doc, re.M)) - {"SPOTVISOR_RUN_ID"}
        self.assertEqual(documented - set(keys), set(), "docs/configuration.md documents keys the code does not have")

    def test_every_event_name_in_the_code_is_documented(self):
        # Event names are string literals "area.name" passed to the logger.
        names = set()
        for dirpath, _, files in os.walk(os.path.join(ROOT, "lib")):
            for f in files:
                if f.endswith(".cc") and not f.endswith("_test.cc"):
                    src = open(os.path.join(dirpath, f)).read()
                    names |= set(re.findall(r'(?:Log|Info|Warn|Error)\(\s*(?:LogEvent\{\s*Severity::k\w+,\s*|Severity::k\w+,\s*)?"([a-z_]+\.[a-z_]+)"', src))
        self.assertGreater(len(names), 15, names)
        doc = open(os.path.join(ROOT, "docs", "events.md")).read()
        missing = sorted(n for n in names if f"`{n}`" not in doc)
        self.assertEqual(missing, [], "events missing from docs/events.md")


class CliTest(unittest.TestCase):
    def test_help_for_every_command(self):
        for cmd in ("daemon", "run", "config", "status", "sync", "release", "checkpoint", "version"):
            out = run(cmd, "--help")
            self.assertEqual(out.returncode, 0, cmd)
            self.assertTrue(out.stdout.startswith(f"Usage: spotvisor {cmd}"), out.stdout)
            self.assertEqual(run("help", cmd).stdout, out.stdout)
        self.assertIn("spotvisor daemon", run("--help").stdout)

    def test_usage_errors_exit_64(self):
        self.assertEqual(run("frobnicate").returncode, 64)
        self.assertEqual(run().returncode, 64)
        out = run("daemon", "--set", "a=b")
        self.assertEqual(out.returncode, 64)
        self.assertIn('unknown option "--set"', out.stderr)
        self.assertEqual(run("run", "--set").returncode, 64)
        self.assertEqual(run("run", "--set", "novalue").returncode, 64)
        self.assertEqual(run("run", "--").returncode, 64)

    def test_a_command_without_its_dashes_gets_one_line_that_shows_the_right_form(self):
        # Issue #32: 32 lines of usage for `spotvisor run python3 train.py`.
        out = run("run", "python3", "train.py", "--lr", "3")
        self.assertEqual(out.returncode, 64)
        self.assertIn('"python3" is not an option', out.stderr)
        self.assertIn("spotvisor run -- python3 train.py --lr 3", out.stderr)
        self.assertLessEqual(len(out.stderr.splitlines()), 3, out.stderr)
        out = run("status", "--bogus")
        self.assertEqual(out.returncode, 64)
        self.assertIn('unknown option "--bogus"', out.stderr)
        self.assertIn("spotvisor status --help", out.stderr)

    def test_config_takes_the_command_after_dashes_as_documented(self):
        import sys
        sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))
        from fake_metadata import FakeMetadataServer
        srv = FakeMetadataServer().start()
        self.addCleanup(srv.stop)
        out = run("config", "--json", "--", "python3", "train.py", env=dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{srv.port}"))
        self.assertEqual(out.returncode, 0, out.stderr)
        command = json.loads(out.stdout)["keys"]["command"]
        self.assertEqual((json.loads(command["value"]), command["origin"]), (["python3", "train.py"], "command line (after --)"))

    def test_version(self):
        out = run("version")
        self.assertRegex(out.stdout, r"^spotvisor \d+\.\d+\.\d+\n$")

    def test_checkpoint_done_touches_the_marker(self):
        import tempfile
        d = tempfile.mkdtemp(prefix="spotvisor-cli-")
        try:
            marker = os.path.join(d, ".spotvisor-complete")
            out = run("checkpoint", "--done", "--dir", d)
            self.assertEqual(out.returncode, 0, out.stderr)
            first = os.stat(marker).st_mtime_ns
            os.utime(marker, ns=(first - 10**9, first - 10**9))
            env = dict(os.environ, SPOTVISOR_CHECKPOINT_DIR=d)
            out = subprocess.run([SPOTVISOR, "checkpoint", "--done"], capture_output=True, text=True, env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertGreater(os.stat(marker).st_mtime_ns, first - 10**9, "touched again: newer")
            self.assertEqual(run("checkpoint").returncode, 64)  # no action
            self.assertEqual(run("checkpoint", "--done", "--dir", os.path.join(d, "missing")).returncode, 1)
        finally:
            shutil.rmtree(d, True)

    def test_status_without_a_daemon(self):
        out = run("status", "--state-dir", "/nonexistent-spotvisor-state")
        self.assertEqual(out.returncode, 4)
        self.assertIn("no status in /nonexistent-spotvisor-state", out.stderr)


if __name__ == "__main__":
    unittest.main()
