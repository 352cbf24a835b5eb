#!/usr/bin/python3
"""Gang soak (issue #28): state that outlives a boot, across gangs.

Each run is one gang (2 or 3 real spotvisors, `gang-on-loss = wait`,
`gang-checkpoint = all` or `leader`) on one real etcd and the fake Cloud
Storage, driven through a random series of faults drawn from the run's seed:

  preempt       a member is preempted; it comes back (same disk, or a new one)
  kill          a member's spotvisor and trainer are killed -9 (a host failure)
  kill_final    a member is preempted and rank 0 is killed -9 during its final sync
  kill_restoring a member is preempted, and killed -9 again while it restores on its way back
  restart       a member's spotvisor is stopped (SIGTERM) and started again at once
  etcd_restart  etcd is killed and started again on the same data
  etcd_wipe     etcd is killed and started empty (a new cluster: generations from 1)
  resize        every member is stopped; the gang starts again one larger or smaller
  gc            `spotvisor gc --keep 0 --delete` on the bucket while the gang trains
  pull          `spotvisor pull` of the run (leader) or of rank 0 (all) while it trains

then every member finishes. Invariants, checked after every fault and at the end:

  one-commit     every rank of a generation that resumed resumed a save of one
                 generation (its SPOTVISOR_GANG_SET_ID: a set is never mixed); in
                 leader mode every rank resumes rank 0's commit
  no-rollback    a generation never resumes an older step than the one before it
  live-kept      nothing a manifest names is deleted while the run is live (gc)
  aside-kept     nothing set aside on a disk (.spotvisor-unverified/) is ever lost
  pull-whole     a pull beside the live run gets one commit, whole
  done           the run ends with DONE and every member exits 0

    /usr/bin/python3 tests/soak/gang_soak.py --runs 200          # the full soak
    /usr/bin/python3 tests/soak/gang_soak.py --runs 1 --seed 7 -v --keep

The short form runs in ctest (tests/integration/test_gang_soak_short.py).
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))
import harness  # noqa: E402
from harness import Spotvisor, wait_until  # noqa: E402
from fake_metadata import FakeMetadataServer  # noqa: E402
from fake_gcs import FakeGcsServer  # noqa: E402
import test_gang  # noqa: E402  (its trainer and its etcd)

FAULTS = ["preempt", "kill", "kill_final", "kill_restoring", "restart", "etcd_restart", "etcd_wipe", "resize", "gc",
          "pull"]
BUCKET = "soak-bucket"
GANG = "soak"


class Violation(Exception):
    pass


class Run:
    def __init__(self, seed, binary, quick, verbose, keep):
        self.seed, self.binary, self.verbose, self.keep = seed, binary, verbose, keep
        rng = random.Random(seed)
        self.rng = rng
        self.mode = rng.choice(["all", "leader"])
        self.size = rng.choice([2, 3])
        n = rng.randint(2, 3) if quick else rng.randint(3, 6)
        self.faults = [rng.choice(FAULTS) for _ in range(n)]
        self.violations = []
        self.generations = 0
        self.last_start = 0
        self.members = {}
        self.disk = {}  # instance -> disk number (a new VM gets a new disk)
        self.aside = {}  # disk dir -> set of files seen under .spotvisor-unverified/

    def say(self, text):
        if self.verbose:
            print(f"[seed {self.seed}] {text}", flush=True)

    def violate(self, kind, detail):
        self.violations.append((kind, detail))
        self.say(f"VIOLATION {kind}: {detail}")

    # ------------------------------------------------------------ the world

    def setup(self):
        self.tmp = tempfile.mkdtemp(prefix=f"spotvisor-gang-soak-{self.seed}-")
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out)
        self.trainer = os.path.join(self.tmp, "trainer.py")
        with open(self.trainer, "w") as f:
            f.write(test_gang.TRAINER)
        self.gcs = FakeGcsServer(buckets=[BUCKET]).start()
        self.etcd_dir = os.path.join(self.tmp, "etcd")
        self.etcd = test_gang.Etcd(self.tmp).start()
        self.env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.gcs.port}"}

    def teardown(self):
        for name, m in self.members.items():
            self.kill9(m)
            m["metadata"].stop()
            self.save_log(name, m)
        self.etcd.stop()
        self.gcs.stop()
        if self.keep is True or (self.keep == "failed" and self.violations):
            print(f"[seed {self.seed}] kept {self.tmp}", flush=True)
        else:
            shutil.rmtree(self.tmp, True)

    def dirs(self, name):
        d = os.path.join(self.tmp, f"disk-{name}-{self.disk[name]}")
        return os.path.join(d, "ckpt"), os.path.join(d, "state")

    def start(self, k, size, new_disk=False):
        name = f"vm-{k}"
        if new_disk or name not in self.disk:
            self.disk[name] = self.disk.get(name, -1) + 1
        ckpt, state = self.dirs(name)
        metadata = FakeMetadataServer(instance_name=name).start()
        ip = f"127.0.0.{k + 2}"
        metadata.set("instance/network-interfaces/0/ip", ip)
        sets = {
            "gang": GANG, "gang-size": str(size), "gang-etcd": self.etcd.url, "gang-address": ip,
            "gang-checkpoint": self.mode, "gang-on-loss": "wait", "gang-reform-timeout": "120s",
            "bucket": f"gs://{BUCKET}/runs", "checkpoint-dir": ckpt, "state-dir": state,
            "sync-interval": "0", "sync-settle": "0s", "stop-timeout": "5s", "kill-timeout": "2s",
            "metadata-watch-timeout": "5s", "gang-form-timeout": "120s", "gang-lease-ttl": "3s",
            "gang-master-port": "29777", "run-claim-ttl": "1m",
            "env": f"MEMBER={name}\nGANG_OUT={self.out}",
            "on-exit": "poweroff", "shutdown-command": "true",
        }
        args = ["run"]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        args += ["--", "/usr/bin/python3", self.trainer]
        old = self.members.get(name)
        if old:
            old["metadata"].stop()
            self.save_log(name, old)
        self.members[name] = {"proc": Spotvisor(args, dict(self.env, GCE_METADATA_HOST=f"127.0.0.1:{metadata.port}")),
                              "metadata": metadata, "state": state, "k": k}
        self.note_aside(name)

    def save_log(self, name, m):
        """Each spotvisor's raw log lines and stderr, kept with --keep: spotvisor-vm-K.N.log."""
        n = len([f for f in os.listdir(self.tmp) if f.startswith(f"spotvisor-{name}.")])
        with open(os.path.join(self.tmp, f"spotvisor-{name}.{n}.log"), "w") as f:
            f.write("\n".join(m["proc"].raw) + "\n--- stderr\n" + m["proc"].stderr)

    def kill9(self, m):
        try:
            with open(os.path.join(m["state"], "status.json")) as f:
                pid = json.load(f).get("trainer_pid")
        except (OSError, ValueError):
            pid = None
        m["proc"].kill()
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass

    def spotvisor(self, *args, timeout=60):
        return subprocess.run([self.binary, *args], env=dict(os.environ, **self.env), capture_output=True,
                              text=True, timeout=timeout)

    # ---------------------------------------------------------- invariants

    def note_aside(self, name):
        ckpt, _ = self.dirs(name)
        root = os.path.join(ckpt, ".spotvisor-unverified")
        seen = self.aside.setdefault(ckpt, set())
        for f in list(seen):
            if not os.path.exists(f):
                self.violate("aside-kept", f"{f} was set aside and is gone")
                seen.discard(f)
        for d, _, files in os.walk(root):
            seen.update(os.path.join(d, f) for f in files)

    def clear_envs(self):
        for f in os.listdir(self.out):
            if f.startswith("env-"):
                os.remove(os.path.join(self.out, f))

    def wait_generation(self, timeout=90):
        """Every member's trainer of one new generation started: check what they resumed."""
        names = sorted(self.members)
        paths = [os.path.join(self.out, f"env-{n}.json") for n in names]

        def read():
            envs = {}
            for n, p in zip(names, paths):
                try:
                    with open(p) as f:
                        envs[n] = json.load(f)
                except (OSError, ValueError):
                    return None
            return envs

        def started():
            for n in names:
                code = self.members[n]["proc"].proc.poll()
                if code is not None:
                    last = [f"{e.get('event')}: {e.get('message', '')[:160]}" for e in self.members[n]["proc"].events[-4:]]
                    raise AssertionError(f"{n} exited {code} while the gang formed: {last}")
            envs = read()
            # A generation that formed with a member already dying (its lease
            # not yet expired) starts some trainers before it ends: wait for
            # the generation every member is in.
            return envs is not None and len({e["SPOTVISOR_GANG_GENERATION"] for e in envs.values()}) == 1
        try:
            wait_until(started, timeout, "every member's trainer of one generation to start")
        except AssertionError:
            envs = read()
            if envs is None:
                raise
            self.violate("one-commit", "members never came to one generation: "
                         f"{ {n: e['SPOTVISOR_GANG_GENERATION'] for n, e in envs.items()} }")
        envs = read()
        gens = {e["SPOTVISOR_GANG_GENERATION"] for e in envs.values()}
        steps = {n: e["start_step"] for n, e in envs.items()}
        self.generations += 1
        self.say(f"generation {gens}: steps {steps}, by {[e['ckpt_by'] for e in envs.values()]}")
        if len(gens) != 1:
            self.violate("one-commit", f"members in different generations: {gens}")
        # What each rank resumed was saved in one generation: the set its
        # save was tagged with (SPOTVISOR_GANG_SET_ID, unique across etcds).
        # Steps may differ: a rank new to a grown gang started from scratch.
        sets = {e["ckpt_set"] for e in envs.values() if e["start_step"] > 0}
        if len(sets) > 1:
            self.violate("one-commit", f"ranks resumed saves of different sets: "
                         f"{ {n: (e['start_step'], e['ckpt_set']) for n, e in envs.items()} }")
        if self.mode == "leader" and len(set(steps.values())) > 1:
            self.violate("one-commit", f"leader mode: not every rank resumed rank 0's commit: {steps}")
        top = max(steps.values())
        if top < self.last_start:
            self.violate("no-rollback", f"resumed step {top} after step {self.last_start}")
        self.last_start = max(self.last_start, top)
        for n in names:
            self.note_aside(n)

    def check_live_kept(self):
        prefixes = [f"runs/{GANG}/"] if self.mode == "leader" else [f"runs/{GANG}/rank-{k}/" for k in range(3)]
        names = {o["name"] for o in self.gcs.objects(BUCKET, f"runs/{GANG}/")}
        for p in prefixes:
            if p + "manifest.json" not in names:
                continue
            manifest = json.loads(self.gcs.get_object_bytes(BUCKET, p + "manifest.json"))
            for e in manifest["files"]:
                if p + e["object"] not in names:
                    self.violate("live-kept", f"{p}{e['object']} ({e['path']}) is named by a manifest and gone")

    # -------------------------------------------------------------- faults

    def stop_and_wait(self, names, sig=signal.SIGTERM):
        for n in names:
            self.members[n]["proc"].proc.send_signal(sig)
        for n in names:
            self.members[n]["proc"].wait_exit(timeout=60)

    def fault(self, kind):
        rng = self.rng
        names = sorted(self.members)
        victim = rng.choice(names)
        k = self.members[victim]["k"]
        self.say(f"fault {kind} ({victim})")
        if kind in ("preempt", "kill", "restart"):
            self.clear_envs()
            if kind == "preempt":
                self.members[victim]["metadata"].set("instance/preempted", "TRUE")
                self.members[victim]["proc"].wait_exit(timeout=60)
            elif kind == "kill":
                self.kill9(self.members[victim])
            else:
                self.stop_and_wait([victim])
            time.sleep(rng.uniform(0, 4))
            self.start(k, self.size, new_disk=kind != "restart" and rng.random() < 0.3)
            self.wait_generation()
        elif kind == "kill_final":
            others = [n for n in names if n != "vm-0"]
            rank0 = self.members["vm-0"]
            self.clear_envs()
            self.members[others[0]]["metadata"].set("instance/preempted", "TRUE")
            rank0["proc"].wait_event("supervisor.state", timeout=60, to="syncing")
            time.sleep(rng.uniform(0, 0.05))
            self.kill9(rank0)
            self.members[others[0]]["proc"].wait_exit(timeout=60)
            self.start(self.members[others[0]]["k"], self.size)
            self.start(0, self.size, new_disk=rng.random() < 0.3)
            self.wait_generation()
        elif kind == "kill_restoring":
            self.clear_envs()
            self.members[victim]["metadata"].set("instance/preempted", "TRUE")
            self.members[victim]["proc"].wait_exit(timeout=60)
            self.start(k, self.size)
            back = self.members[victim]
            # At boot, or once formed again: whichever restore comes first.
            back["proc"].wait_event("restore.start", timeout=60)
            time.sleep(rng.uniform(0, 0.02))
            self.kill9(back)
            self.start(k, self.size)
            self.wait_generation()
        elif kind in ("etcd_restart", "etcd_wipe"):
            self.clear_envs()
            self.etcd.stop()
            if kind == "etcd_wipe":
                shutil.rmtree(os.path.join(self.etcd.dir, "data"), True)
            time.sleep(rng.uniform(0, 2))
            self.etcd.start()
            # A restart within the lease TTL keeps the generation; a longer
            # one, or a wipe, ends it and the gang forms again.
            time.sleep(4)
            if kind == "etcd_wipe" or any(f.startswith("env-") for f in os.listdir(self.out)):
                self.wait_generation()
        elif kind == "resize":
            new = 3 if self.size == 2 else 2
            self.clear_envs()
            self.stop_and_wait(names)
            for n in names:
                m = self.members.pop(n)
                m["metadata"].stop()
                self.save_log(n, m)
            self.size = new
            for k in range(new):
                self.start(k, new)
            # A bigger gang's new rank starts fresh; the others resume.
            self.wait_generation()
        elif kind == "gc":
            r = self.spotvisor("gc", "--keep", "0", "--delete", f"gs://{BUCKET}/runs")
            self.say(f"gc: exit {r.returncode}: {r.stdout.strip()[-200:]} {r.stderr.strip()[-200:]}")
            if r.returncode != 0:
                self.violate("live-kept", f"gc failed: {r.stderr.strip()[-300:]}")
            self.check_live_kept()
        elif kind == "pull":
            target = os.path.join(self.tmp, f"pull-{time.monotonic_ns()}")
            run = f"gs://{BUCKET}/runs/{GANG}" + ("" if self.mode == "leader" else "/rank-0")
            r = self.spotvisor("pull", run, target)
            if r.returncode != 0 and "nothing was committed" not in r.stderr:  # before rank 0's first commit
                self.violate("pull-whole", f"pull failed: {r.stderr.strip()[-300:]}")
            elif r.returncode == 0 and os.path.exists(os.path.join(target, "model")):
                with open(os.path.join(target, "model")) as f:
                    words = f.read().split()
                if len(words) != 6 or words[0] != "step" or words[4] != "set":
                    self.violate("pull-whole", f"the pulled model file is not a whole save: {words}")

    # ----------------------------------------------------------------- run

    def execute(self):
        self.setup()
        try:
            self.say(f"mode {self.mode}, size {self.size}, faults {self.faults}")
            for k in range(self.size):
                self.start(k, self.size)
            self.wait_generation()
            for kind in self.faults:
                self.fault(kind)
                self.check_live_kept()
            with open(os.path.join(self.out, "exit-all"), "w") as f:
                f.write("0")
            for n, m in sorted(self.members.items()):
                code = m["proc"].wait_exit(timeout=90)
                if code != 0:
                    self.violate("done", f"{n} exited {code}")
            names = {o["name"] for o in self.gcs.objects(BUCKET, f"runs/{GANG}/")}
            if f"runs/{GANG}/DONE" not in names:
                self.violate("done", "no DONE")
            for n in self.members:
                self.note_aside(n)
        except Exception as e:  # a bound that ran out is a finding, with the run's seed
            self.violate("stuck", f"{type(e).__name__}: {str(e)[:300]}")
        finally:
            self.teardown()
        return self.violations


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bin", default=os.environ.get("SPOTVISOR_BIN", os.path.join(ROOT, "build-asan", "daemon", "spotvisor")))
    ap.add_argument("--quick", action="store_true", help="2-3 faults a run instead of 3-6")
    ap.add_argument("--keep", action="store_true", help="keep every run's temp dir")
    ap.add_argument("--keep-failed", action="store_true", help="keep the temp dirs of runs with violations")
    ap.add_argument("--json", help="write every run's plan and violations here")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1, 1 << 20)
    harness.SPOTVISOR = a.bin
    print(f"gang soak: {a.runs} run(s) from seed {seed}, {a.bin}", flush=True)
    results, faults, bad = [], {}, 0
    started = time.monotonic()
    for i in range(a.runs):
        r = Run(seed + i, a.bin, a.quick, a.v, True if a.keep else ("failed" if a.keep_failed else False))
        v = r.execute()
        for f in r.faults:
            faults[f] = faults.get(f, 0) + 1
        results.append({"seed": r.seed, "mode": r.mode, "faults": r.faults, "generations": r.generations,
                        "violations": v})
        if v:
            bad += 1
            for kind, detail in v:
                print(f"seed {r.seed} ({r.mode}): {kind}: {detail}\n  replay: /usr/bin/python3 {__file__} --runs 1 "
                      f"--seed {r.seed} -v --keep", flush=True)
        else:
            print(f"run {i + 1}/{a.runs} seed {r.seed}: ok ({r.mode}, {len(r.faults)} faults, {r.generations} generations)",
                  flush=True)
    took = time.monotonic() - started
    gens = sum(r["generations"] for r in results)
    print(f"gang soak: {a.runs} run(s), {sum(faults.values())} faults ({', '.join(f'{k} {v}' for k, v in sorted(faults.items()))}), "
          f"{gens} generations checked, {bad} run(s) with violations, {took:.0f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
