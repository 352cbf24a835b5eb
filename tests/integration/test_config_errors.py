"""Bad configuration is caught before anything starts: exit 78, the error names source, key and problem."""
import http.server
import json
import os
import subprocess
import threading
import unittest

from harness import SpotvisorTestCase, FAKE_TRAINER, SPOTVISOR


class ConfigErrorTest(SpotvisorTestCase):
    def run_config_error(self, args=None, attrs=None, config=None, trainer=None):
        for k, v in (attrs or {}).items():
            self.metadata.set(f"instance/attributes/{k}", v)
        marker = self.path("marker")
        cmd = ["run"]
        if config:
            cmd += ["--config", config]
        # Only the directories on the command line: --set is the top layer and
        # would hide the bad values these tests put in lower layers.
        cmd += ["--set", f"state-dir={self.path('state')}", "--set", f"checkpoint-dir={self.path('ckpt')}"]
        cmd += args or []
        if trainer is not False:
            cmd += ["--", FAKE_TRAINER, "--marker-file", marker]
        p = self.start(cmd)
        self.assertEqual(p.wait_exit(), 78, "".join(p.raw))
        self.assertFalse(os.path.exists(marker), "the trainer must not start")
        self.assertFalse(p.find("trainer.start"))
        end = p.wait_event("run.end")
        self.assertEqual(end["reason"], "config-error")
        return [e["message"] for e in p.find("config.error")], p

    def test_bad_duration_in_instance_metadata(self):
        errors, _ = self.run_config_error(attrs={"spotvisor-stop-timeout": "20 sec"})
        self.assertEqual(errors, ['instance metadata spotvisor-stop-timeout: "20 sec" is not a duration (try 20s, 15m or 1h30m)'])

    def test_bad_value_in_project_metadata(self):
        self.metadata.set("project/attributes/spotvisor-on-exit", "reboot")
        errors, _ = self.run_config_error()
        self.assertEqual(errors, ['project metadata spotvisor-on-exit: "reboot" is not one of: poweroff, stop, delete, none'])

    def test_bad_value_in_the_file_names_file_and_line(self):
        conf = self.write_config("# spotvisor\nkill-timeout = forever\n")
        errors, _ = self.run_config_error(config=conf)
        self.assertEqual(errors, [f'{conf}:2 kill-timeout: "forever" is not a duration (try 20s, 15m or 1h30m)'])

    def test_syntax_error_in_the_file(self):
        conf = self.write_config('command = "unterminated\n')
        errors, _ = self.run_config_error(config=conf)
        self.assertEqual(errors, [f"{conf}:1: unterminated quoted value (missing closing \")"])

    def test_missing_explicit_config_file(self):
        errors, _ = self.run_config_error(config=self.path("nope.conf"))
        self.assertIn("nope.conf", errors[0])

    def test_user_that_does_not_exist(self):
        errors, _ = self.run_config_error(attrs={"spotvisor-user": "no-such-user-xyz"})
        self.assertEqual(errors, ['instance metadata spotvisor-user: user "no-such-user-xyz" does not exist on this machine'])

    def test_workdir_that_cannot_be_created(self):
        errors, _ = self.run_config_error(attrs={"spotvisor-workdir": "/proc/spotvisor-cannot-exist"})
        self.assertEqual(len(errors), 1)
        self.assertTrue(errors[0].startswith('instance metadata spotvisor-workdir: cannot create "/proc/spotvisor-cannot-exist"'), errors)

    def test_empty_command(self):
        errors, _ = self.run_config_error(attrs={"spotvisor-command": "  "}, trainer=False)
        self.assertEqual(len(errors), 1)
        self.assertIn("no command to run", errors[0])

    def test_malformed_exec_form(self):
        errors, _ = self.run_config_error(attrs={"spotvisor-command": '["python", "train.py"'}, trainer=False)
        self.assertTrue(errors[0].startswith("instance metadata spotvisor-command: "), errors)
        self.assertIn("not a JSON array", errors[0])

    def test_unknown_key_on_the_command_line(self):
        errors, _ = self.run_config_error(args=["--set", "stop-timout=3s"])
        self.assertEqual(errors, ["--set stop-timout: unknown key (did you mean stop-timeout?)"])

    def test_all_problems_are_reported_at_once(self):
        errors, _ = self.run_config_error(attrs={"spotvisor-stop-timeout": "x", "spotvisor-kill-timeout": "y"})
        self.assertEqual(len(errors), 2)

    def test_every_mistake_in_a_file_is_reported_in_one_pass_and_the_good_lines_count(self):
        # Issue #32: one syntax error hid the rest and added a false "no command to
        # run" though `command` was on line 1; a key given twice silently kept the last.
        conf = self.write_config(f'command = {FAKE_TRAINER} --run-for 1\n'
                                 "this line has no equals sign\n"
                                 "kill-timeout = forever\n"
                                 "sync-interval = 5m\n"
                                 "sync-interval = 1m\n"
                                 'env = "A=1"\n'
                                 'env = "B=2"\n')
        errors, _ = self.run_config_error(config=conf, trainer=False)
        self.assertEqual(len(errors), 4, errors)
        self.assertIn(f'{conf}:2: expected `key = value`', errors[0])
        self.assertTrue(any(f"{conf}:3 kill-timeout" in e for e in errors), errors)
        self.assertTrue(any(f"{conf}:5 sync-interval: given again (first on line 4)" in e for e in errors), errors)
        self.assertTrue(any(f"{conf}:7 env: given again (first on line 6)" in e and "A=1\\nB=2" in e for e in errors), errors)
        self.assertFalse([e for e in errors if "command" in e], "command is on line 1")

    def test_pairs_joined_by_commas_where_lines_are_expected_get_a_warning_showing_the_right_form(self):
        # gcloud's --metadata separates with commas: spotvisor-env=LR=0.1,MODE=offline
        # arrives as one line, one variable LR with the value "0.1,MODE=offline".
        self.metadata.set("instance/attributes/spotvisor-env", "LR=0.1,MODE=offline")
        self.metadata.set("instance/attributes/spotvisor-log-labels", "team=ml,exp=3")
        p = self.start(["run", "--set", f"state-dir={self.path('state')}", "--", FAKE_TRAINER, "--run-for", "1"])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw))
        warnings = [w["message"] for w in p.find("config.warning") if "joined by commas" in w["message"]]
        self.assertEqual(len(warnings), 2, warnings)
        self.assertIn("spotvisor-env", warnings[0] + warnings[1])
        self.assertIn('env = "A=1\\nB=2"', warnings[0] + warnings[1])

    @unittest.skipUnless(os.geteuid() == 0, "runs the trainer as another user: needs root")
    def test_a_checkpoint_dir_the_trainers_user_cannot_write_fails_before_the_trainer_starts(self):
        # Issue #32: found at the first save, an epoch after the start, and the VM powered off.
        ckpt = self.path("root-owned")
        os.makedirs(ckpt)
        os.chmod(os.path.dirname(ckpt), 0o755)  # nobody may reach it, as /var/lib would let it
        os.chmod(ckpt, 0o755)  # root's, as a directory made by hand or by the package
        workdir = self.path("work")
        os.makedirs(workdir)
        os.chmod(workdir, 0o777)
        p = self.start(["run", "--set", f"state-dir={self.path('state')}", "--set", f"checkpoint-dir={ckpt}",
                        "--set", "user=nobody", "--set", f"workdir={workdir}", "--", FAKE_TRAINER, "--run-for", "1"])
        self.assertEqual(p.wait_exit(), 78, "".join(p.raw))
        self.assertFalse(p.find("trainer.start"))
        (error,) = [e["message"] for e in p.find("config.error")]
        self.assertIn(f'user nobody cannot create a file in "{ckpt}": Permission denied', error)
        self.assertIn(f"chown -R nobody {ckpt}", error)
        self.assertEqual(os.listdir(ckpt), [], "the probe leaves nothing behind")
        # Writable for that user: the run goes on.
        os.chmod(ckpt, 0o777)
        p2 = self.start(["run", "--set", f"state-dir={self.path('state')}", "--set", f"checkpoint-dir={ckpt}",
                         "--set", "user=nobody", "--set", f"workdir={workdir}", "--", FAKE_TRAINER, "--run-for", "1"])
        self.assertEqual(p2.wait_exit(), 0, "".join(p2.raw))
        self.assertFalse([f for f in os.listdir(ckpt) if "probe" in f])

    def test_unknown_attribute_is_a_warning_with_a_suggestion_not_an_error(self):
        self.metadata.set("instance/attributes/spotvisor-stop-timout", "30s")
        p = self.run_trainer(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        w = p.wait_event("config.warning")
        self.assertEqual(w["message"], "instance metadata spotvisor-stop-timout: unknown spotvisor attribute, ignored "
                                       "(did you mean spotvisor-stop-timeout?)")

    def test_a_broken_config_still_names_its_run_in_every_line(self):
        # Issue #32: config.error and run.end carried only the instance label,
        # so the quickstart's query on labels.run_id could not show why the VM stopped.
        _, p = self.run_config_error(attrs={"spotvisor-run-id": "mnist-1", "spotvisor-stop-timeout": "20 sec"})
        for name in ("config.error", "run.end"):
            labels = p.wait_event(name)["logging.googleapis.com/labels"]
            self.assertEqual(labels.get("run_id"), "mnist-1", name)
        # A run-id that is itself the problem is not used as a label.
        _, p2 = self.run_config_error(attrs={"spotvisor-run-id": "../bad id"})
        self.assertNotIn("run_id", p2.wait_event("run.end")["logging.googleapis.com/labels"])

    def test_config_error_in_daemon_mode_still_powers_off_once(self):
        # A VM whose configuration is broken must not sit there billing.
        out = self.path("shutdown")
        conf = self.write_config(f'shutdown-command = "echo off >> {out}"\nstate-dir = {self.path("state")}\n')
        self.metadata.set("instance/attributes/spotvisor-command", "true")
        self.metadata.set("instance/attributes/spotvisor-kill-timeout", "soon")
        p = self.start(["daemon", "--config", conf])
        self.assertEqual(p.wait_exit(), 78)
        self.assertEqual(self.read(out), "off\n")
        self.assertEqual(p.wait_event("run.end")["reason"], "config-error")


class ConfigCommandTest(SpotvisorTestCase):
    def test_config_shows_every_key_with_its_source(self):
        import json
        import subprocess
        from harness import SPOTVISOR
        conf = self.write_config("stop-timeout = 30s\n")
        self.metadata.set("project/attributes/spotvisor-kill-timeout", "9s")
        self.metadata.set("instance/attributes/spotvisor-command", "python train.py")
        env = dict(os.environ, **self.env())
        out = subprocess.run([SPOTVISOR, "config", "--config", conf, "--set", "run-id=exp1", "--json"],
                             capture_output=True, text=True, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        keys = json.loads(out.stdout)["keys"]
        self.assertEqual(keys["stop-timeout"], {"value": "30s", "source": "file", "origin": f"{conf}:1 stop-timeout"})
        self.assertEqual(keys["kill-timeout"]["source"], "project metadata")
        self.assertEqual(keys["command"]["source"], "instance metadata")
        self.assertEqual(keys["run-id"]["source"], "command line")
        self.assertEqual(keys["state-dir"]["source"], "default")
        text = subprocess.run([SPOTVISOR, "config", "--config", conf], capture_output=True, text=True, env=env)
        self.assertEqual(text.returncode, 0)
        self.assertRegex(text.stdout, r"stop-timeout\s+= \"30s\"\s+# .*spotvisor.conf:1 stop-timeout")
        self.assertRegex(text.stdout, r"command\s+= \"python train.py\"\s+# instance metadata spotvisor-command")
        bad = subprocess.run([SPOTVISOR, "config", "--config", conf, "--set", "stop-timeout=20 sec"],
                             capture_output=True, text=True, env=env)
        self.assertEqual(bad.returncode, 78)
        self.assertIn('error: --set stop-timeout: "20 sec" is not a duration', bad.stderr)

class OutsideBytesTest(SpotvisorTestCase):
    """Issue #12: bytes from outside (arguments, files, the metadata server) end in a clear error, never SIGABRT."""

    run_config_error = ConfigErrorTest.run_config_error

    def test_config_naming_a_directory_is_an_error(self):
        os.mkdir(self.path("conf.d"))
        errors, _ = self.run_config_error(config=self.path("conf.d"))
        self.assertEqual(errors, [f"config file {self.path('conf.d')}: is a directory, not a file"])

    def test_a_byte_order_mark_does_not_hide_the_first_key(self):
        conf = self.path("bom.conf")
        with open(conf, "wb") as f:
            f.write(b"\xef\xbb\xbfkill-timeout = forever\n")
        errors, _ = self.run_config_error(config=conf)
        self.assertEqual(errors, [f'{conf}:1 kill-timeout: "forever" is not a duration (try 20s, 15m or 1h30m)'])

    def test_a_400_digit_duration_is_a_config_error(self):
        errors, _ = self.run_config_error(args=["--set", "stop-timeout=" + "9" * 400 + "s"])
        self.assertEqual(len(errors), 1)
        self.assertTrue(errors[0].startswith('--set stop-timeout: "9999'), errors)
        self.assertIn("too long a duration", errors[0])

    def test_a_file_bucket_inside_checkpoint_dir_is_a_config_error(self):
        ckpt = self.path("ckpt")
        errors, _ = self.run_config_error(args=["--set", f"bucket=file://{ckpt}/store"])
        self.assertEqual(errors, [f'--set bucket: "file://{ckpt}/store" is inside checkpoint-dir {ckpt}: the store would be '
                                  "synced into itself; keep the file:// store outside checkpoint-dir"])

    def test_an_argument_that_is_not_utf8_is_passed_byte_for_byte(self):
        marker = os.fsencode(self.path("marker")) + b"-caf\xe9"
        p = self.start(["run"] + self.base_sets() + ["--", FAKE_TRAINER, "--run-for", "0", "--marker-file", marker])
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw) + p.stderr)
        self.assertTrue(os.path.exists(marker))

    def test_a_config_value_that_is_not_utf8_is_a_clear_error(self):
        conf = self.path("latin1.conf")
        with open(conf, "wb") as f:
            f.write(b"on-exit = arr\xeat\n")
        errors, _ = self.run_config_error(config=conf)
        self.assertEqual(errors, [f'{conf}:1 on-exit: "arr\\xeat" is not one of: poweroff, stop, delete, none'])

    def test_status_json_with_wrong_types_is_a_clear_error(self):
        state = self.path("state")
        os.mkdir(state)
        with open(os.path.join(state, "status.json"), "w") as f:
            json.dump({"phase": "running", "spotvisor_pid": "x"}, f)
        for cmd in (["status"], ["status", "--json"], ["sync", "--timeout", "1s"], ["release"]):
            out = subprocess.run([SPOTVISOR] + cmd + ["--state-dir", state], capture_output=True, text=True)
            self.assertEqual(out.returncode, 4, (cmd, out.stderr))
            self.assertIn('status.json: "spotvisor_pid" is a string, expected a whole number', out.stderr)


class _BrokenMetadata(http.server.BaseHTTPRequestHandler):
    """A metadata server whose instance/attributes/ answer is set per test."""
    attributes = (200, b"{}")

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/computeMetadata/v1/instance/attributes/":
            code, body = self.attributes
        elif path == "/computeMetadata/v1/project/attributes/":
            code, body = 200, b"{}"
        elif path == "/computeMetadata/v1/instance/name":
            code, body = 200, b"broken-vm"
        else:
            code, body = 404, b"not found"
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("ETag", "e1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        self.send_response(404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class BrokenMetadataServerTest(SpotvisorTestCase):
    def serve(self, code, body):
        handler = type("Handler", (_BrokenMetadata,), {"attributes": (code, body)})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return {"GCE_METADATA_HOST": f"127.0.0.1:{server.server_address[1]}"}

    def test_malformed_attribute_json_ends_the_run_with_a_clear_error(self):
        env = self.serve(200, b'{"spotvisor-command": "tr\xffue"')
        conf = self.write_config(f"shutdown-command = true\nstate-dir = {self.path('state')}\nlog-to = stdout\n")
        # Before: `daemon` retried it forever after one log line, `run` ran without metadata.
        for args in (["run"] + self.base_sets(**{"log-to": "stdout"}), ["daemon", "--config", conf]):
            p = self.start(args, env=env)
            self.assertEqual(p.wait_exit(), 78, "".join(p.raw))
            errors = [e["message"] for e in p.find("config.error")]
            self.assertEqual(len(errors), 1, errors)
            self.assertTrue(errors[0].startswith("metadata server: metadata instance/attributes/: expected a JSON object of "
                                                 'attributes, got malformed JSON "{"spotvisor-command": "tr\\xffue""'),
                            errors)

    def test_attributes_answered_with_404_are_no_attributes(self):
        env = self.serve(404, b"not found")
        p = self.start(["run"] + self.base_sets(**{"log-to": "stdout"}) + ["--", FAKE_TRAINER, "--run-for", "0",
                                                                            "--marker-file", self.path("marker")], env=env)
        self.assertEqual(p.wait_exit(), 0, "".join(p.raw) + p.stderr)
        self.assertTrue(os.path.exists(self.path("marker")))


if __name__ == "__main__":
    unittest.main()
