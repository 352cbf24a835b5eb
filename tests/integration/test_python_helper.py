"""The trainer helper (python/spotvisor.py) on its own: the SIGINT flag, the
marker, and the Hugging Face and Lightning callbacks driven by the
frameworks' loops as tests/fakes/frameworks/ reproduces them. Each case runs
in a fresh interpreter (the helper installs its handler at import)."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPER_DIR = os.path.join(ROOT, "python")
FRAMEWORKS = os.path.join(ROOT, "tests", "fakes", "frameworks")


class PythonHelperTest(unittest.TestCase):
    def run_py(self, code, env=None):
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join([FRAMEWORKS, HELPER_DIR])
        e.update(env or {})
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                           timeout=60)
        return r

    def test_sigint_sets_the_flag_and_a_second_one_raises(self):
        r = self.run_py("""
            import os, signal, spotvisor
            assert not spotvisor.preempted()
            os.kill(os.getpid(), signal.SIGINT)
            assert spotvisor.preempted(), "flag set"
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                print("second raised")
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "second raised")

    def test_a_handler_the_trainer_installed_first_is_left_alone(self):
        r = self.run_py("""
            import os, signal
            got = []
            signal.signal(signal.SIGINT, lambda s, f: got.append(s))
            import spotvisor
            assert spotvisor.install() is False
            os.kill(os.getpid(), signal.SIGINT)
            assert got == [signal.SIGINT] and not spotvisor.preempted()
        """)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_saved_touches_the_marker_past_the_clock_tick_and_is_a_no_op_outside_spotvisor(self):
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, ".spotvisor-complete")
            r = self.run_py(f"""
                import os, time, spotvisor
                with open(os.path.join({d!r}, "model.pt"), "w") as f:
                    f.write("x")
                spotvisor.saved()
                assert os.stat({marker!r}).st_mtime_ns > os.stat(os.path.join({d!r}, "model.pt")).st_mtime_ns
            """, env={"SPOTVISOR_CHECKPOINT_MARKER": marker})
            self.assertEqual(r.returncode, 0, r.stderr)
        r = self.run_py("""
            import os, spotvisor
            os.environ.pop("SPOTVISOR_CHECKPOINT_MARKER", None)
            spotvisor.saved()
        """)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_hugging_face_saves_at_the_end_of_the_step_under_way_and_stops(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_py("""
                import os, signal, spotvisor
                from transformers import Trainer
                saves, steps = [], []
                def step(n):
                    steps.append(n)
                    if n == 7:
                        os.kill(os.getpid(), signal.SIGINT)  # the preemption, mid-step
                t = Trainer(step, saves.append, save_steps=5, max_steps=100)
                t.add_callback(spotvisor.HuggingFace())
                t.train()
                print(steps[-1], saves)
            """, env={"SPOTVISOR_CHECKPOINT_MARKER": os.path.join(d, ".spotvisor-complete")})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "7 [5, 7]")
            self.assertTrue(os.path.exists(os.path.join(d, ".spotvisor-complete")), "touched after on_save")

    def test_lightning_saves_last_ckpt_at_the_end_of_the_batch_and_stops(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_py(f"""
                import os, signal, spotvisor
                from lightning.pytorch import ModelCheckpoint, Trainer
                written = []
                def step(n):
                    if n == 7:
                        os.kill(os.getpid(), signal.SIGINT)
                t = Trainer(step, lambda path, s: written.append((os.path.basename(path), s)),
                            [spotvisor.Lightning(), ModelCheckpoint({d!r}, 5)], max_steps=100)
                t.fit()
                print(t.global_step, written)
            """, env={"SPOTVISOR_CHECKPOINT_MARKER": os.path.join(d, ".spotvisor-complete")})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(),
                             "7 [('epoch=0-step=5.ckpt', 5), ('last.ckpt', 5), ('last.ckpt', 7)]")
            self.assertTrue(os.path.exists(os.path.join(d, ".spotvisor-complete")))

    def test_importing_it_needs_nothing_but_the_standard_library(self):
        r = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path.insert(0, %r); import spotvisor" % HELPER_DIR],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
