"""Gang training (issue #16): several spotvisors, one real etcd, one bucket.

Each member is a real spotvisor with its own fake metadata server (its own
instance name) and its own loopback address (127.0.0.K, all of 127/8 is
loopback), checkpoint dir and state dir; they coordinate through a real etcd
(Debian's etcd-server) started by the test, and share a file:// bucket. The
trainer is a small script that records the environment it was given, writes
a checkpoint, and exits when told to (a file) or on SIGINT.
"""
import glob
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from harness import ROOT, Spotvisor, wait_until, pid_alive, WAIT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes"))
from fake_metadata import FakeMetadataServer  # noqa: E402

TRAINER = r'''
import json, os, signal, sys, time
out, member = os.environ["GANG_OUT"], os.environ["MEMBER"]
keys = ("SPOTVISOR_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NNODES", "NODE_RANK", "OMPI_")
env = {k: v for k, v in os.environ.items() if k.startswith(keys)}
ckpt = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
start, by = 0, ""
try:
    with open(os.path.join(ckpt, "model")) as f:
        words = f.read().split()
        start, by = int(words[1]), words[3]
        env["ckpt_set"] = words[5] if len(words) > 5 else ""
except (FileNotFoundError, IndexError, ValueError):
    pass
env["start_step"], env["ckpt_by"] = start, by
def save(step):
    tmp = os.path.join(ckpt, "model.tmp")
    with open(tmp, "w") as f:
        f.write(f"step {step} by {member} set {os.environ.get('SPOTVISOR_GANG_SET_ID', '-')}\n")
    os.rename(tmp, os.path.join(ckpt, "model"))
def on_int(signum, frame):
    time.sleep(float(os.environ.get("SLOW_STOP", "0")))  # a trainer slow to stop: its final sync comes late
    save(start + 1)
    with open(os.path.join(out, f"sigint-{member}"), "w") as f:
        f.write(repr(time.time()))
    sys.exit(130)
signal.signal(signal.SIGINT, on_int)
with open(os.path.join(out, f"env-{member}.tmp"), "w") as f:
    json.dump(env, f)
os.rename(os.path.join(out, f"env-{member}.tmp"), os.path.join(out, f"env-{member}.json"))
# PEER_WATCH=vm-0,vm-1,...: like a collective (gloo, NCCL), fail at once when
# a peer of this generation is gone ("Connection closed by peer").
generation = os.environ.get("SPOTVISOR_GANG_GENERATION", "0")
peers = [p for p in os.environ.get("PEER_WATCH", "").split(",") if p and p != member]
with open(os.path.join(out, f"pid-{member}-g{generation}"), "w") as f:
    f.write(str(os.getpid()))
def peer_gone():
    for p in peers:
        try:
            with open(os.path.join(out, f"pid-{p}-g{generation}")) as f:
                pid = int(f.read() or 0)
        except (FileNotFoundError, ValueError):
            continue  # not started yet
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return p
    return None
while True:
    gone = peer_gone() if peers else None
    if gone:
        print(f"RuntimeError: [gloo] Connection closed by peer ({gone})", file=sys.stderr, flush=True)
        sys.exit(1)
    for name in (f"exit-{member}", "exit-all"):
        p = os.path.join(out, name)
        if os.path.exists(p):
            with open(p) as f:
                code = int(f.read().strip() or 0)
            if code == 0:
                save(start + 1)
                os.remove(os.path.join(out, f"pid-{member}-g{generation}"))  # finished: not a lost peer
            sys.exit(code)
    time.sleep(0.02)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A real single-member etcd on loopback, in its own data dir."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "etcd")
        os.makedirs(self.dir, exist_ok=True)
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.proc = None

    def start(self):
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.log = open(os.path.join(self.dir, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [shutil.which("etcd") or "/usr/bin/etcd", "--name=it", f"--data-dir={self.dir}/data",
             f"--listen-client-urls={self.url}", f"--advertise-client-urls={self.url}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=it={peer}", "--logger=zap", "--log-outputs=stderr"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)

        def healthy():
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=1) as s:
                    s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                    return b'"health":"true"' in s.recv(4096)
            except OSError:
                return False
        wait_until(healthy, what="etcd healthy")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc:
            self.log.close()


class GangTestCase(unittest.TestCase):
    NAME = "g1"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-gang-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out)
        self.trainer = os.path.join(self.tmp, "trainer.py")
        with open(self.trainer, "w") as f:
            f.write(TRAINER)
        self.bucket = os.path.join(self.tmp, "bucket")
        os.makedirs(self.bucket)
        self.etcd = Etcd(self.tmp).start()
        self.addCleanup(self.etcd.stop)
        self.members = {}
        self.addCleanup(self._kill_all)

    def _kill_all(self):
        for m in self.members.values():
            m["proc"].kill()
            m["metadata"].stop()
        # A member whose spotvisor was killed leaves its trainer behind.
        for path in glob.glob(os.path.join(self.tmp, "state-*", "status.json")):
            try:
                with open(path) as f:
                    pid = json.load(f).get("trainer_pid")
                if pid:
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def start_member(self, k, size=3, address=True, command=None, ip=None, env=None, trainer_env="", **sets):
        """Member vm-K at 127.0.0.(K+2) (or `ip`): given as gang-address, or (address=False) by the metadata server."""
        name = f"vm-{k}"
        ip = ip or f"127.0.0.{k + 2}"
        metadata = FakeMetadataServer(instance_name=name).start()
        metadata.set("instance/network-interfaces/0/ip", ip)
        base = {
            "gang": self.NAME, "gang-size": str(size), "gang-etcd": self.etcd.url,
            "bucket": f"file://{self.bucket}", "checkpoint-dir": os.path.join(self.tmp, f"ckpt-{k}"),
            "state-dir": os.path.join(self.tmp, f"state-{k}"), "sync-interval": "0", "sync-settle": "0s",
            "stop-timeout": "5s", "kill-timeout": "2s", "metadata-watch-timeout": "5s",
            "gang-form-timeout": "60s", "gang-lease-ttl": "3s", "gang-master-port": "29777",
            "env": f"MEMBER={name}\nGANG_OUT={self.out}" + (f"\n{trainer_env}" if trainer_env else ""),
            "on-exit": "poweroff", "shutdown-command": f"touch {self.tmp}/poweroff-{name}",
        }
        if address:
            base["gang-address"] = ip
        base.update(sets)
        args = ["run"]
        for key, value in base.items():
            args += ["--set", f"{key}={value}"]
        args += ["--"] + (command or ["/usr/bin/python3", self.trainer])
        proc = Spotvisor(args, dict(env or {}, GCE_METADATA_HOST=f"127.0.0.1:{metadata.port}"))
        self.members[name] = {"proc": proc, "metadata": metadata, "ip": ip}
        return proc

    def env_of(self, name, timeout=WAIT):
        path = os.path.join(self.out, f"env-{name}.json")
        wait_until(lambda: os.path.exists(path), timeout, f"{name}'s trainer to start")
        with open(path) as f:
            return json.load(f)

    def sigint_time(self, name, timeout=WAIT):
        path = os.path.join(self.out, f"sigint-{name}")
        wait_until(lambda: os.path.exists(path) and os.path.getsize(path) > 0, timeout, f"SIGINT in {name}'s trainer")
        with open(path) as f:
            return float(f.read())

    def form(self, n=3, **sets):
        procs = [self.start_member(k, size=n, **sets) for k in range(n)]
        for p in procs:
            p.wait_event("gang.formed", timeout=30)
        return procs


class GangTest(GangTestCase):
    def test_three_members_form_with_ranks_by_address_and_complete_together(self):
        # vm-2 gives no gang-address: its IP comes from the metadata server.
        procs = [self.start_member(0), self.start_member(1), self.start_member(2, address=False)]
        formed = [p.wait_event("gang.formed", timeout=30) for p in procs]
        self.assertEqual({f["generation"] for f in formed}, {formed[0]["generation"]}, "one generation for all")
        envs = {f"vm-{k}": self.env_of(f"vm-{k}") for k in range(3)}
        hosts = "127.0.0.2,127.0.0.3,127.0.0.4"
        for k in range(3):
            e = envs[f"vm-{k}"]
            # Lowest address is rank 0 (seed 004: it runs mpiexec).
            self.assertEqual(e["SPOTVISOR_GANG_RANK"], str(k), e)
            self.assertEqual(e["RANK"], str(k))
            self.assertEqual(e["NODE_RANK"], str(k))
            self.assertEqual(e["WORLD_SIZE"], "3")
            self.assertEqual(e["NNODES"], "3")
            self.assertEqual(e["SPOTVISOR_GANG_SIZE"], "3")
            self.assertEqual(e["LOCAL_RANK"], "0")
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.2")
            self.assertEqual(e["MASTER_PORT"], "29777")
            self.assertEqual(e["SPOTVISOR_GANG"], self.NAME)
            self.assertEqual(e["SPOTVISOR_GANG_HOSTS"], hosts)
            self.assertEqual(e["SPOTVISOR_GANG_GENERATION"], str(formed[0]["generation"]))
            self.assertEqual(e["SPOTVISOR_RUN_ID"], self.NAME, "the gang is one run")
            with open(e["SPOTVISOR_GANG_HOSTFILE"]) as f:
                self.assertEqual(f.read(), "127.0.0.2 slots=1\n127.0.0.3 slots=1\n127.0.0.4 slots=1\n")
        # Status shows the gang, and every member's phase (published through etcd).
        def status_of(k):
            with open(os.path.join(self.tmp, f"state-{k}", "status.json")) as f:
                return json.load(f)

        def phases(k):
            return [m.get("phase") for m in status_of(k)["gang"]["members"]]
        wait_until(lambda: phases(1) == ["running"] * 3, what="every member shown running on vm-1")
        st = status_of(1)
        self.assertEqual(st["gang"]["rank"], 1)
        self.assertEqual([m["instance"] for m in st["gang"]["members"]], ["vm-0", "vm-1", "vm-2"])
        from harness import SPOTVISOR
        shown = subprocess.run([SPOTVISOR, "status", "--state-dir", os.path.join(self.tmp, "state-1")],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn(f"gang:        {self.NAME}, rank 1 of 3, generation {formed[0]['generation']}", shown.stdout)
        self.assertIn("rank 2: vm-2 (127.0.0.4), running", shown.stdout)
        # rank 1 finishes first: it waits for the others, and nobody is stopped.
        with open(os.path.join(self.out, "exit-vm-1"), "w") as f:
            f.write("0")
        procs[1].wait_event("gang.done")
        procs[1].wait_event("supervisor.state", to="gang-waiting")
        # The others see it waiting for them.
        wait_until(lambda: phases(0) == ["running", "gang-waiting", "running"], what="vm-1 shown gang-waiting on vm-0")
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            end = p.wait_event("run.end")
            self.assertEqual(end["reason"], "completed", end)
            ended = p.wait_event("gang.ended")
            self.assertIn("completed", ended["reason"])
        for k in range(3):
            self.assertFalse(os.path.exists(os.path.join(self.out, f"sigint-vm-{k}")), "nobody was stopped")
            self.assertTrue(os.path.exists(os.path.join(self.tmp, f"poweroff-vm-{k}")), "on-exit ran everywhere")
        # Only rank 0 synced, and it wrote DONE once the whole gang had finished.
        self.assertTrue(procs[0].find("done.written"))
        for p in procs[1:]:
            self.assertTrue(p.find("sync.follower"))
            self.assertFalse(p.find("sync.complete"), "a follower never writes to the bucket")
        self.assertTrue(os.path.exists(os.path.join(self.bucket, self.NAME, "DONE")))
        # A new boot of the gang finds DONE and does not train again.
        p = self.start_member(0)
        self.assertEqual(p.wait_exit(timeout=30), 0)
        self.assertEqual(p.wait_event("run.end")["reason"], "already-done")

    def test_one_member_preempted_stops_every_trainer_and_rank0_syncs(self):
        procs = self.form()
        for k in range(3):
            self.env_of(f"vm-{k}")
        self.members["vm-2"]["metadata"].set("instance/preempted", "TRUE")
        times = [self.sigint_time(f"vm-{k}") for k in range(3)]
        self.assertLess(max(times) - min(times), 5.0, times)
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 130)
        self.assertEqual(procs[2].wait_event("run.end")["reason"], "preempted")
        for p in procs[:2]:
            self.assertEqual(p.wait_event("run.end")["reason"], "gang-ended")
            ended = p.wait_event("gang.ended")
            self.assertIn("vm-2 (rank 2): preempted", ended["reason"])
        # The survivors run on-exit (gang-on-loss = stop); GCE takes the preempted VM itself.
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "poweroff-vm-0")))
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "poweroff-vm-1")))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "poweroff-vm-2")))
        # Rank 0's checkpoint after SIGINT is committed; no DONE.
        final = procs[0].wait_event("sync.complete")
        self.assertTrue(final)
        self.assertFalse(os.path.exists(os.path.join(self.bucket, self.NAME, "DONE")))
        # The gang boots again (the preempted VM came back): every member
        # restores rank 0's checkpoint and they resume together with the same ranks.
        for name in list(self.members):
            self.members[name]["metadata"].stop()
        self.members.clear()
        shutil.rmtree(self.out)
        os.makedirs(self.out)
        procs = self.form()
        for k in range(3):
            e = self.env_of(f"vm-{k}")
            self.assertEqual(e["SPOTVISOR_GANG_RANK"], str(k))
            self.assertEqual(e["SPOTVISOR_RESUMED"], "1")
            self.assertEqual(e["start_step"], 1, "every member restored rank 0's checkpoint")
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)

    def test_gang_on_loss_wait_the_others_reform_with_the_member_that_comes_back(self):
        wait = {"gang-on-loss": "wait", "gang-reform-timeout": "60s"}
        procs = self.form(**wait)
        for k in range(3):
            self.env_of(f"vm-{k}")
        self.members["vm-2"]["metadata"].set("instance/preempted", "TRUE")
        self.assertEqual(procs[2].wait_exit(timeout=30), 130)
        for p in procs[:2]:
            p.wait_event("gang.reforming", timeout=30)
            self.assertFalse(p.find("run.end"), "a member left waiting has not ended its run")
        for k in range(3):
            os.remove(os.path.join(self.out, f"env-vm-{k}.json"))
        # The preempted VM comes back (a new spotvisor, the same name) with a new address
        # that sorts first: it keeps its rank all the same (ranks follow the name).
        self.members["vm-2"]["metadata"].stop()
        procs[2] = self.start_member(2, ip="127.0.0.1", **wait)
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(3)]
        generations = {e["SPOTVISOR_GANG_GENERATION"] for e in envs}
        self.assertEqual(len(generations), 1, envs)
        self.assertNotEqual(generations.pop(), "1", "a new generation")
        for k, e in enumerate(envs):
            self.assertEqual(e["SPOTVISOR_GANG_RANK"], str(k), "the same ranks")
            self.assertEqual(e["SPOTVISOR_GANG_HOSTS"], "127.0.0.2,127.0.0.3,127.0.0.1", "the new address, at its rank")
            self.assertEqual(e["SPOTVISOR_RESUMED"], "1")
            self.assertEqual(e["start_step"], 1)
            # Every member resumed from rank 0's checkpoint, not its own save.
            self.assertEqual(e["ckpt_by"], "vm-0", e)
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertTrue(os.path.exists(os.path.join(self.bucket, self.NAME, "DONE")))

    def test_gang_on_loss_wait_survivors_whose_trainers_fail_on_a_peer_killed_without_a_word_form_again(self):
        # Issue #28 point 3: a host failure (spotvisor and trainer killed -9)
        # breaks the survivors' collective at once, their trainers fail on
        # "Connection closed by peer", and etcd says the peer is gone only
        # when its lease expires. That is the gang's loss: they wait for the
        # member to come back instead of ending as failed.
        wait = {"gang-on-loss": "wait", "gang-reform-timeout": "60s"}
        peers = "PEER_WATCH=vm-0,vm-1,vm-2"
        procs = self.form(trainer_env=peers, **wait)
        for k in range(3):
            self.env_of(f"vm-{k}")
        with open(os.path.join(self.tmp, "state-2", "status.json")) as f:
            trainer = json.load(f)["trainer_pid"]
        procs[2].kill()
        os.killpg(trainer, signal.SIGKILL)
        for p in procs[:2]:
            exit_event = p.wait_event("trainer.exit", timeout=30)
            self.assertEqual(exit_event["exit_code"], 1, "the survivor's trainer failed first, on the lost connection")
            taken = p.wait_event("gang.loss_taken", timeout=30)
            self.assertIn("forming again", taken["message"])
            p.wait_event("gang.reforming", timeout=30)
            self.assertFalse(p.find("run.end"), "a survivor has not ended its run")
            self.assertFalse(p.find("gang.ending"), "a survivor did not end the generation as its own failure")
        for k in range(3):
            os.remove(os.path.join(self.out, f"env-vm-{k}.json"))
        self.members["vm-2"]["metadata"].stop()
        procs[2] = self.start_member(2, trainer_env=peers, **wait)
        envs = [self.env_of(f"vm-{k}", timeout=40) for k in range(3)]
        self.assertEqual(len({e["SPOTVISOR_GANG_GENERATION"] for e in envs}), 1, envs)
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")

    def test_a_real_failure_that_takes_the_others_trainers_down_ends_everyone_failed(self):
        # The edge of the rule above: nobody is lost, so a failure stands,
        # also for the members whose trainers failed only on the connection.
        wait = {"gang-on-loss": "wait", "gang-reform-timeout": "60s"}
        procs = self.form(trainer_env="PEER_WATCH=vm-0,vm-1,vm-2", **wait)
        for k in range(3):
            self.env_of(f"vm-{k}")
        with open(os.path.join(self.out, "exit-vm-1"), "w") as f:
            f.write("3")
        codes = [p.wait_exit(timeout=40) for p in procs]
        self.assertEqual(codes, [1, 3, 1])
        for p in procs:
            self.assertEqual(p.wait_event("run.end")["reason"], "failed")
            self.assertFalse(p.find("gang.loss_taken"))
            self.assertFalse(p.find("gang.reforming"))
        self.assertTrue(any(p.find("gang.no_loss") for p in procs), "someone waited out the grace and said so")

    def test_a_member_that_boots_during_rank0s_final_sync_resumes_from_its_commit(self):
        # Issue #28: members restored at boot, before forming, and not again
        # after: one that booted while rank 0's final sync was still going
        # resumed from an older commit than the others (steps 9, 7, 7).
        wait = {"gang-on-loss": "wait", "gang-reform-timeout": "60s"}
        procs = [self.start_member(0, size=2, trainer_env="SLOW_STOP=4", **wait),
                 self.start_member(1, size=2, **wait)]
        for p in procs:
            p.wait_event("gang.formed", timeout=30)
        for k in range(2):
            self.env_of(f"vm-{k}")
            os.remove(os.path.join(self.out, f"env-vm-{k}.json"))
        self.members["vm-1"]["metadata"].set("instance/preempted", "TRUE")
        self.assertEqual(procs[1].wait_exit(timeout=30), 130)
        # vm-1 is back at once: its boot's restore finds nothing yet, since
        # rank 0's trainer takes 4 s to stop and its final sync comes after.
        self.members["vm-1"]["metadata"].stop()
        procs[1] = self.start_member(1, size=2, **wait)
        procs[1].wait_event("restore.none", timeout=30)
        self.assertFalse(procs[0].find("sync.complete", kind="final"), "rank 0 is still stopping")
        envs = [self.env_of(f"vm-{k}", timeout=40) for k in range(2)]
        for e in envs:
            self.assertEqual((e["start_step"], e["ckpt_by"]), (1, "vm-0"), "every rank from rank 0's final commit")
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)

    def test_a_member_that_finished_waits_for_a_busy_rank0_as_long_as_it_is_alive(self):
        # Issue #28: members that finished ended the generation after
        # gang-form-timeout, so rank 0's evaluation or export after its last
        # step got SIGINT and DONE was never written.
        sets = {"gang-form-timeout": "4s"}
        procs = [self.start_member(k, size=2, **sets) for k in range(2)]
        for p in procs:
            p.wait_event("gang.formed", timeout=30)
        for k in range(2):
            self.env_of(f"vm-{k}")
        with open(os.path.join(self.out, "exit-vm-1"), "w") as f:
            f.write("0")
        procs[1].wait_event("supervisor.state", to="gang-waiting")
        # Rank 0 is busy for more than twice gang-form-timeout.
        procs[1].wait_event("gang.still_waiting", timeout=30)
        wait_until(lambda: len(procs[1].find("gang.still_waiting")) >= 2, timeout=30, what="two gang-form-timeouts")
        self.assertFalse(os.path.exists(os.path.join(self.out, "sigint-vm-0")), "rank 0 was never stopped")
        with open(os.path.join(self.out, "exit-vm-0"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertTrue(os.path.exists(os.path.join(self.bucket, self.NAME, "DONE")))

    def test_gang_on_loss_wait_gives_up_after_the_reform_timeout(self):
        wait = {"gang-on-loss": "wait", "gang-reform-timeout": "3s"}
        procs = self.form(n=2, **wait)
        for k in range(2):
            self.env_of(f"vm-{k}")
        self.members["vm-1"]["metadata"].set("instance/preempted", "TRUE")
        self.assertEqual(procs[1].wait_exit(timeout=30), 130)
        self.assertEqual(procs[0].wait_exit(timeout=30), 75)
        self.assertIn("gang-reform-timeout", procs[0].wait_event("gang.form_timeout")["message"])
        self.assertEqual(procs[0].wait_event("run.end")["reason"], "gang-form-failed")
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "poweroff-vm-0")), "on-exit after giving up")

    def test_restart_on_failure_restarts_the_whole_gang(self):
        sets = {"gang-on-loss": "wait", "gang-reform-timeout": "60s", "restart": "on-failure", "restart-delay": "1s"}
        procs = self.form(**sets)
        for k in range(3):
            self.env_of(f"vm-{k}")
        with open(os.path.join(self.out, "exit-vm-1"), "w") as f:
            f.write("3")
        procs[1].wait_event("restart.scheduled", timeout=30)
        os.remove(os.path.join(self.out, "exit-vm-1"))
        for k in range(3):
            os.remove(os.path.join(self.out, f"env-vm-{k}.json"))
        self.sigint_time("vm-0")
        self.sigint_time("vm-2")
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(3)]
        self.assertEqual(len({e["SPOTVISOR_GANG_GENERATION"] for e in envs}), 1, envs)
        self.assertEqual([e["SPOTVISOR_GANG_RANK"] for e in envs], ["0", "1", "2"])
        self.assertEqual(envs[1]["SPOTVISOR_RESTART_COUNT"], "1", "the failed member counts its restart")
        self.assertEqual(envs[0]["SPOTVISOR_RESTART_COUNT"], "0")
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")

    def test_a_trainer_failure_ends_the_generation_for_all(self):
        procs = self.form()
        for k in range(3):
            self.env_of(f"vm-{k}")
        with open(os.path.join(self.out, "exit-vm-1"), "w") as f:
            f.write("3")
        self.sigint_time("vm-0")
        self.sigint_time("vm-2")
        self.assertEqual(procs[1].wait_exit(timeout=30), 3)
        self.assertEqual(procs[1].wait_event("run.end")["reason"], "failed")
        for p in (procs[0], procs[2]):
            self.assertEqual(p.wait_exit(timeout=30), 130)
            self.assertIn("vm-1 (rank 1): trainer failed (exit code 3)", p.wait_event("gang.ended")["reason"])
        for k in range(3):
            self.assertTrue(os.path.exists(os.path.join(self.tmp, f"poweroff-vm-{k}")), "on-exit ran everywhere")

    def test_a_member_killed_without_a_word_is_gone_when_its_lease_expires(self):
        procs = self.form()
        envs = [self.env_of(f"vm-{k}") for k in range(3)]
        del envs
        with open(os.path.join(self.tmp, "state-1", "status.json")) as f:
            trainer = json.load(f)["trainer_pid"]
        procs[1].kill()  # SIGKILL: no end record, no lease revoke
        os.killpg(trainer, signal.SIGKILL)  # the VM is gone with it
        killed = time.monotonic()
        self.sigint_time("vm-0", timeout=30)
        self.sigint_time("vm-2", timeout=30)
        took = time.monotonic() - killed
        self.assertLess(took, 3 + 10, "noticed within the lease TTL and a margin")
        for p in (procs[0], procs[2]):
            self.assertEqual(p.wait_exit(timeout=30), 130)
            self.assertIn("vm-1", p.wait_event("gang.ended")["reason"])
            self.assertIn("gone", p.wait_event("gang.ended")["reason"])

    def test_form_timeout_with_a_member_missing_runs_on_exit_everywhere(self):
        procs = [self.start_member(k, **{"gang-form-timeout": "3s"}) for k in range(2)]
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 75)
            p.wait_event("gang.form_timeout")
            self.assertEqual(p.wait_event("run.end")["reason"], "gang-form-failed")
            self.assertFalse(p.find("trainer.start"))
        for k in range(2):
            self.assertTrue(os.path.exists(os.path.join(self.tmp, f"poweroff-vm-{k}")), "no VM waits forever")

    def test_members_that_disagree_on_the_size_refuse_to_form_and_name_both(self):
        # A member that sees the other refuses (exit 78, naming both). The other may
        # have looked before the first registered, or after it left: it waits for its
        # gang-form-timeout like any member short of company (exit 75). Nobody trains.
        a = self.start_member(0, size=2, **{"gang-form-timeout": "8s"})
        b = self.start_member(1, size=3, **{"gang-form-timeout": "8s"})
        codes = sorted(p.wait_exit(timeout=30) for p in (a, b))
        self.assertIn(codes, ([78, 78], [75, 78]))
        for p in (a, b):
            self.assertFalse(p.find("trainer.start"))
            for failed in p.find("gang.form_failed"):
                self.assertIn("vm-0", failed["message"])
                self.assertIn("vm-1", failed["message"])
                self.assertIn("size", failed["message"])

    def test_two_runs_under_one_gang_name_refuse_to_form_and_name_both_run_ids(self):
        # Issue #28: project metadata sets spotvisor-gang, each VM its own
        # run-id: ranks of run A and run B trained together.
        a = self.start_member(0, size=2, **{"gang-form-timeout": "8s", "run-id": "run-a"})
        b = self.start_member(1, size=2, **{"gang-form-timeout": "8s", "run-id": "run-b"})
        codes = sorted(p.wait_exit(timeout=30) for p in (a, b))
        self.assertIn(codes, ([78, 78], [75, 78]))
        said = []
        for p in (a, b):
            self.assertFalse(p.find("trainer.start"), "nobody trains")
            said += [e["message"] for e in p.find("gang.form_failed")]
        self.assertTrue(said)
        for message in said:
            self.assertIn("disagree on run-id", message)
            self.assertIn('"run-a"', message)
            self.assertIn('"run-b"', message)

    def test_etcd_down_at_boot_is_waited_out(self):
        self.etcd.stop()
        procs = [self.start_member(k, size=2) for k in range(2)]
        for p in procs:
            p.wait_event("gang.etcd_unavailable")
        self.etcd.start()
        for p in procs:
            p.wait_event("gang.formed", timeout=30)
            p.wait_event("gang.etcd_recovered")
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)

    def test_etcd_lost_mid_run_does_not_stop_the_trainers(self):
        procs = self.form(n=2)
        for k in range(2):
            self.env_of(f"vm-{k}")
        self.etcd.stop()
        for p in procs:
            p.wait_event("gang.etcd_unavailable", timeout=30)
        # Longer than the lease TTL (3 s): nobody can expire anything while etcd is down.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for k in range(2):
                self.assertFalse(os.path.exists(os.path.join(self.out, f"sigint-vm-{k}")))
            time.sleep(0.1)  # watching for an unwanted SIGINT over a span, not waiting for one
        self.etcd.start()
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=40), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")

    def test_checkpoint_all_each_rank_resumes_its_own_shard_and_never_a_mixed_set(self):
        """gang-checkpoint = all: every rank syncs its own dir under rank-K/; a
        generation counts only once every rank's final sync of it committed."""
        run = os.path.join(self.bucket, self.NAME)

        def names(prefix):
            d = os.path.join(run, prefix)
            return [prefix + n for n in os.listdir(d)] if os.path.isdir(d) else []
        self._checkpoint_all({}, lambda name: os.path.exists(os.path.join(run, name)), names)

    def test_checkpoint_all_on_cloud_storage(self):
        """The same against the fake Cloud Storage: prefix listings, preconditions
        (DONE once: ifGenerationMatch=0) and deletes through the JSON API."""
        from fake_gcs import FakeGcsServer
        gcs = FakeGcsServer(buckets=["gang-bucket"]).start()
        self.addCleanup(gcs.stop)
        run = f"runs/{self.NAME}/"
        # env: the spotvisor processes' environment (start_member's parameter).
        self._checkpoint_all({"bucket": "gs://gang-bucket/runs", "env": {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{gcs.port}"}},
                             lambda name: any(o["name"] == run + name for o in gcs.objects("gang-bucket", run + name)),
                             lambda prefix: [o["name"][len(run):] for o in gcs.objects("gang-bucket", run + prefix)])

    def _checkpoint_all(self, store, exists, names):
        sets = dict(store, **{"gang-checkpoint": "all", "gang-on-loss": "wait", "gang-reform-timeout": "60s"})

        def fresh_envs():
            for k in range(3):
                p = os.path.join(self.out, f"env-vm-{k}.json")
                if os.path.exists(p):
                    os.remove(p)

        procs = self.form(**sets)
        envs = [self.env_of(f"vm-{k}") for k in range(3)]
        self.assertEqual([e["start_step"] for e in envs], [0, 0, 0])
        gen1 = int(envs[0]["SPOTVISOR_GANG_GENERATION"])
        # Generation 1 ends with vm-2's preemption: each rank saves its own
        # shard (step 1) and commits its share; the set is whole.
        fresh_envs()
        self.members["vm-2"]["metadata"].set("instance/preempted", "TRUE")
        self.assertEqual(procs[2].wait_exit(timeout=30), 130)
        for k, p in enumerate(procs):
            share = p.wait_event("gang.share_committed", timeout=30)
            self.assertEqual((share["generation"], share["rank"]), (gen1, k), share)
        self.assertTrue(any(p.find("gang.share_committed", set_complete=True) for p in procs))
        # Each share is named by its set: when the generation was formed, its number, the
        # gang's size and the id minted with it (issue #28), the same in every rank.
        ids = set()
        for k in range(3):
            shares = [n for n in names(f"rank-{k}/sets/") if re.fullmatch(rf"rank-{k}/sets/set-\d{{19}}-g{gen1:012d}-n3-[0-9a-f]{{16}}\.json", n)]
            self.assertEqual(len(shares), 1, names(f"rank-{k}/sets/"))
            ids.add(shares[0].split("/")[-1])
            self.assertTrue(exists(f"rank-{k}/manifest.json"))
        self.assertEqual(len(ids), 1, "one set, one name")
        # The trainers were told the set's id (SPOTVISOR_GANG_SET_ID), to tag their saves with.
        self.assertEqual({e["SPOTVISOR_GANG_SET_ID"] for e in envs}, {ids.pop()[:-len(".json")].rsplit("-", 1)[1]})
        self.assertFalse(exists("manifest.json"), "no gang-wide manifest: each rank has its own")
        # vm-2 comes back: every rank resumes from its own shard of set 1.
        self.members["vm-2"]["metadata"].stop()
        procs[2] = self.start_member(2, **sets)
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(3)]
        gen2 = int(envs[0]["SPOTVISOR_GANG_GENERATION"])
        self.assertGreater(gen2, gen1)
        for k, e in enumerate(envs):
            self.assertEqual(e["SPOTVISOR_GANG_RANK"], str(k))
            self.assertEqual((e["start_step"], e["ckpt_by"]), (1, f"vm-{k}"), "its own shard, not rank 0's")
        # Generation 2: vm-2 is killed without a word (its final sync never
        # happens). Ranks 0 and 1 save step 2 and commit their shares, but set 2
        # is never whole.
        fresh_envs()
        with open(os.path.join(self.tmp, "state-2", "status.json")) as f:
            trainer = json.load(f)["trainer_pid"]
        procs[2].kill()
        os.killpg(trainer, signal.SIGKILL)
        for k in (0, 1):
            share = procs[k].wait_event("gang.share_committed", timeout=30, generation=gen2)
            self.assertFalse(share["set_complete"], share)
            procs[k].wait_event("gang.reforming", timeout=30)
        # vm-2 comes back: every rank restores set 1; ranks 0 and 1 do not
        # resume from their step-2 saves, which vm-2's shard does not match.
        self.members["vm-2"]["metadata"].stop()
        procs[2] = self.start_member(2, **sets)
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(3)]
        for k, e in enumerate(envs):
            self.assertEqual((e["start_step"], e["ckpt_by"]), (1, f"vm-{k}"), "set 1, the newest whole one")
        for k in (0, 1):
            restored = procs[k].wait_event("gang.set_restore", set_generation=gen1, rolled_back=True, timeout=30)
            self.assertEqual(restored["rank"], k)
        # The gang finishes: DONE once, at the run's root, after the last set is whole.
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertTrue(exists("DONE"))
        self.assertEqual(sum(1 for p in procs if p.find("done.written")), 1, "exactly one rank wrote DONE")

    def _whole_set_at_step_1(self, sets):
        """Two members form, vm-1 is preempted: both ranks save step 1 and commit
        their shares; the set is whole. Both spotvisors have exited."""
        procs = self.form(n=2, **sets)
        for k in range(2):
            self.env_of(f"vm-{k}")
            os.remove(os.path.join(self.out, f"env-vm-{k}.json"))
        self.members["vm-1"]["metadata"].set("instance/preempted", "TRUE")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 130)
        self.assertTrue(any(p.find("gang.share_committed", set_complete=True) for p in procs))
        for k in range(2):
            self.members[f"vm-{k}"]["metadata"].stop()

    def test_checkpoint_all_a_wiped_etcd_never_completes_a_set_with_an_old_epochs_share(self):
        # Issue #28 point 1: shares were named gen-G.json after etcd's
        # generation number; a new or wiped etcd counts from 1 again, and rank 1's
        # old gen-1 share completed rank 0's new gen-1 set: the ranks resumed
        # from different saves (rank 0 at step 2, rank 1 at step 1).
        sets = {"gang-checkpoint": "all"}
        self._whole_set_at_step_1(sets)
        self.etcd.stop()  # etcd-server reinstalled on the coordinator: a new, empty cluster
        self.etcd = Etcd(os.path.join(self.tmp, "etcd-new")).start()
        self.addCleanup(self.etcd.stop)
        procs = [self.start_member(k, size=2, **sets) for k in range(2)]
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(2)]
        self.assertEqual(envs[0]["SPOTVISOR_GANG_GENERATION"], "1", "the new etcd counts from 1 again")
        self.assertEqual([(e["start_step"], e["ckpt_by"]) for e in envs], [(1, "vm-0"), (1, "vm-1")])
        for k in range(2):
            os.remove(os.path.join(self.out, f"env-vm-{k}.json"))
        # vm-1 dies without a word in the new generation 1: rank 0 saves step 2
        # and commits its share; rank 1 never does.
        with open(os.path.join(self.tmp, "state-1", "status.json")) as f:
            trainer = json.load(f)["trainer_pid"]
        procs[1].kill()
        os.killpg(trainer, signal.SIGKILL)
        share = procs[0].wait_event("gang.share_committed", timeout=30)
        self.assertFalse(share["set_complete"], "rank 1's share of the old generation 1 does not complete it")
        self.assertEqual(procs[0].wait_exit(timeout=30), 130)
        for k in range(2):
            self.members[f"vm-{k}"]["metadata"].stop()
        procs = [self.start_member(k, size=2, **sets) for k in range(2)]
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(2)]
        self.assertEqual([(e["start_step"], e["ckpt_by"]) for e in envs], [(1, "vm-0"), (1, "vm-1")],
                         "both ranks from the one whole set, step 1; never rank 0 at step 2 beside rank 1 at step 1")
        procs[0].wait_event("gang.set_restore", rolled_back=True, rank=0)
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)

    def test_checkpoint_all_a_bigger_gang_resumes_from_the_newest_whole_set_and_deletes_nothing(self):
        # Issue #28 point 2: gang-size 2 -> 3 said "no checkpoint set is
        # complete yet: every rank starts from scratch" and deleted every rank's
        # manifest.json.
        self._whole_set_at_step_1({"gang-checkpoint": "all"})
        run = os.path.join(self.bucket, self.NAME)
        before = {k: open(os.path.join(run, f"rank-{k}", "manifest.json")).read() for k in range(2)}
        procs = [self.start_member(k, size=3, **{"gang-checkpoint": "all"}) for k in range(3)]
        envs = [self.env_of(f"vm-{k}", timeout=30) for k in range(3)]
        self.assertEqual([(e["start_step"], e["ckpt_by"]) for e in envs[:2]], [(1, "vm-0"), (1, "vm-1")],
                         "the ranks that were there resume from the set of two")
        self.assertEqual(envs[2]["start_step"], 0, "the new rank starts fresh")
        for k in range(2):
            with open(os.path.join(run, f"rank-{k}", "manifest.json")) as f:
                self.assertEqual(f.read(), before[k], "no committed work deleted")
        with open(os.path.join(self.out, "exit-all"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")

    def _authorized(self, k):
        path = os.path.join(self.tmp, f"home-{k}", ".ssh", "authorized_keys")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [line for line in f.read().splitlines() if "spotvisor-gang:" in line]

    def _leader_sets(self, k):
        os.makedirs(os.path.join(self.tmp, f"home-{k}"), exist_ok=True)
        return {"gang-launch": "leader", "gang-ssh-port": "2222",
                "gang-ssh-authorized-keys": os.path.join(self.tmp, f"home-{k}", ".ssh", "authorized_keys")}

    def test_leader_launch_only_rank0_runs_the_command_the_others_trust_its_key_for_the_generation(self):
        """gang-launch = leader on loopback (no sshd here: test_gang_leader.py runs mpiexec over
        ssh between network namespaces): who runs what, the key's life, completion by rank 0."""
        with open(os.path.join(self.tmp, "home-0-foreign"), "w") as f:
            f.write("x")
        procs = [self.start_member(k, **self._leader_sets(k)) for k in range(3)]
        for p in procs:
            p.wait_event("gang.formed", timeout=30)
            p.wait_event("gang.ssh_ready", timeout=30)
        e = self.env_of("vm-0")
        gen = e["SPOTVISOR_GANG_GENERATION"]
        key = e["SPOTVISOR_GANG_SSH_KEY"]
        self.assertEqual(key, os.path.join(self.tmp, "state-0", "gang-ssh", "id_ed25519"))
        self.assertIn(f"-i {key} -p 2222 ", e["OMPI_MCA_plm_rsh_args"])
        self.assertTrue(os.path.exists(key))
        leader_fp = subprocess.run(["ssh-keygen", "-l", "-f", key + ".pub"], capture_output=True, text=True,
                                   check=True).stdout.split()[1]
        # Only rank 0 ran the command; the others run the stand-in.
        for k in (1, 2):
            start = procs[k].wait_event("trainer.start")
            self.assertIn("gang-host", " ".join(start.get("argv", [])) if isinstance(start.get("argv"), list)
                          else json.dumps(start), start)
            self.assertFalse(os.path.exists(os.path.join(self.out, f"env-vm-{k}.json")), "the command runs on rank 0 only")
            lines = self._authorized(k)
            self.assertEqual(len(lines), 1, lines)
            self.assertTrue(lines[0].startswith('from="127.0.0.2",restrict ssh-ed25519 '), lines[0])
            self.assertTrue(lines[0].endswith(f" spotvisor-gang:{self.NAME}:{gen}"), lines[0])
            # OpenSSH's own parser reads the line as rank 0's key.
            path = os.path.join(self.tmp, f"home-{k}", ".ssh", "authorized_keys")
            fp = subprocess.run(["ssh-keygen", "-l", "-f", path], capture_output=True, text=True, check=True).stdout.split()[1]
            self.assertEqual(fp, leader_fp)
        self.assertEqual(self._authorized(0), [], "rank 0 trusts nobody")
        # rank 0's command finishing is the gang's work done: the stand-ins end with it.
        with open(os.path.join(self.out, "exit-vm-0"), "w") as f:
            f.write("0")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=30), 0)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        for k in (1, 2):
            self.assertEqual(self._authorized(k), [], "the key is gone with the generation")
        self.assertFalse(os.path.exists(key), "rank 0's private key is gone")
        self.assertTrue(os.path.exists(os.path.join(self.bucket, self.NAME, "DONE")))

    def test_leader_launch_a_host_preempted_stops_rank0s_command_and_revokes_the_key(self):
        procs = [self.start_member(k, **self._leader_sets(k)) for k in range(3)]
        for p in procs:
            p.wait_event("gang.ssh_ready", timeout=30)
        self.env_of("vm-0")
        self.assertEqual(len(self._authorized(2)), 1)
        self.members["vm-2"]["metadata"].set("instance/preempted", "TRUE")
        self.sigint_time("vm-0")  # rank 0's command (mpiexec) is stopped at once
        # The stand-in has nothing to save: it exits 0 on SIGINT, even one sent
        # right after it started (the signal is blocked across exec).
        self.assertEqual(procs[2].wait_exit(timeout=30), 0)
        self.assertEqual(procs[2].wait_event("run.end")["reason"], "preempted")
        self.assertEqual(procs[0].wait_exit(timeout=30), 130)
        self.assertEqual(procs[1].wait_exit(timeout=30), 0)
        self.assertEqual(procs[1].wait_event("run.end")["reason"], "gang-ended")
        for k in (1, 2):
            self.assertEqual(self._authorized(k), [], "revoked when the generation ended")


def torch_available():
    return subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed"], capture_output=True).returncode == 0


class GangDdpTest(GangTestCase):
    """examples/ddp_train.py, a real PyTorch DDP trainer (gloo, CPU), as three members of a gang."""

    def lines(self, p, needle):
        return [e["message"] for e in p.events if e.get("event") == "trainer.output" and needle in e.get("message", "")]

    def start_ddp(self, steps):
        port = free_port()
        cmd = ["/usr/bin/python3", os.path.join(ROOT, "examples", "ddp_train.py"), "--steps", str(steps),
               "--step-time", "0.05", "--save-every", "0", "--timeout", "60"]
        procs = [self.start_member(k, command=cmd, **{"gang-master-port": str(port), "stop-timeout": "30s"})
                 for k in range(3)]
        for p in procs:
            p.wait_event("gang.formed", timeout=30)
        return procs

    @unittest.skipUnless(torch_available(), "python3-torch is not installed (scripts/install-deps.sh installs it)")
    def test_ddp_preempted_member_stops_all_ranks_at_one_step_and_the_gang_resumes_there(self):
        procs = self.start_ddp(steps=100000)
        # Every rank is training (a step line each) before the preemption.
        for p in procs:
            wait_until(lambda p=p: self.lines(p, " step="), 60, "a DDP step on every rank")
        self.members["vm-1"]["metadata"].set("instance/preempted", "TRUE")
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=60), 130, "".join(p.raw[-10:]))
        stopped = [self.lines(p, "stopped step=") for p in procs]
        steps = {line.split("stopped step=")[1].split()[0] for ls in stopped for line in ls}
        self.assertEqual(len(steps), 1, f"every rank stops after the same step: {stopped}")
        step = int(steps.pop())
        self.assertTrue(self.lines(procs[0], f"saved step={step}"), "rank 0 saved the step they stopped at")
        self.assertTrue(procs[0].find("sync.complete"), "rank 0's final sync committed it")
        # The gang boots again: every rank restores rank 0's checkpoint and resumes at that step.
        for name in list(self.members):
            self.members[name]["metadata"].stop()
        self.members.clear()
        procs = self.start_ddp(steps=step + 5)
        for p in procs:
            self.assertEqual(p.wait_exit(timeout=90), 0, "".join(p.raw[-10:]))
            start = self.lines(p, "start_step=")
            self.assertTrue(start and f"start_step={step}" in start[0] and "resumed=1" in start[0], start)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        self.assertTrue(os.path.exists(os.path.join(self.bucket, self.NAME, "DONE")))


class GangConfigTest(unittest.TestCase):
    def test_the_etcd_password_is_never_shown(self):
        from harness import SPOTVISOR
        args = [SPOTVISOR, "config", "--json", "--config", "/nonexistent-default-ok"]
        for kv in ("gang=g", "gang-size=x", "gang-etcd=http://127.0.0.1:1", "gang-etcd-user=u",
                   "gang-etcd-password=hunter2-secret", "command=true"):
            args += ["--set", kv]
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 78, out.stderr)  # gang-size=x
        self.assertNotIn("hunter2-secret", out.stdout + out.stderr)
        keys = json.loads(out.stdout)["keys"]
        self.assertEqual(keys["gang-etcd-password"]["value"], "(set, hidden)")
        self.assertTrue(any("gang-size" in e for e in json.loads(out.stdout)["errors"]))


if __name__ == "__main__":
    unittest.main()
