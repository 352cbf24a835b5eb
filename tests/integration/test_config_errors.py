"""Bad configuration is caught before anything starts: exit 78, the error names source, key and problem."""
import os
import unittest

from harness import SpotvisorTestCase, FAKE_TRAINER


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

    def test_unknown_attribute_is_a_warning_with_a_suggestion_not_an_error(self):
        self.metadata.set("instance/attributes/spotvisor-stop-timout", "30s")
        p = self.run_trainer(["--run-for", "10"])
        self.assertEqual(p.wait_exit(), 0)
        w = p.wait_event("config.warning")
        self.assertEqual(w["message"], "instance metadata spotvisor-stop-timout: unknown spotvisor attribute, ignored "
                                       "(did you mean spotvisor-stop-timeout?)")

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


if __name__ == "__main__":
    unittest.main()
