"""Gang training (issue #16) with every "VM" in its own network namespace.

gang_netns.py builds the harness: a bridge, one namespace per member with its
own address, its own fake metadata server at 169.254.169.254:80 and its own
spotvisor (`ip netns exec`), a real etcd in a namespace of its own, and the
fake GCS on the bridge as the bucket. Unlike test_gang.py (loopback, one
network stack for all), a member here can only bind its own address and can
reach the others, etcd and the bucket only over the bridge.

Skipped (saying why) unless root with working `ip netns add`; the DDP test
also needs Debian's python3-torch.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from harness import ROOT, wait_until
from gang_netns import NetnsGang

PYTHON = "/usr/bin/python3"
BUCKET = "gang-bucket"
GANG = "netns-g1"

# Records its environment and the hostfile, then proves the gang environment
# works over the bridge with a tiny rendezvous of its own: rank 0 listens on
# MASTER_ADDR:MASTER_PORT (only possible where that is the machine's own
# address) and notes the address each rank connects from; then all exit 0.
TRAINER = r'''
import json, os, socket, sys, time
out, member = os.environ["GANG_OUT"], os.environ["MEMBER"]
keys = ("SPOTVISOR_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NNODES", "NODE_RANK")
env = {k: v for k, v in os.environ.items() if k.startswith(keys)}
with open(os.environ["SPOTVISOR_GANG_HOSTFILE"]) as f:
    env["hostfile"] = f.read()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
deadline = time.monotonic() + 30
if rank == 0:
    srv = socket.create_server(master)
    srv.settimeout(30)
    peers, conns = {}, []
    while len(peers) < world - 1:
        c, addr = srv.accept()
        peers[c.makefile().readline().strip()] = addr[0]
        conns.append(c)
    for c in conns:
        c.sendall(b"go\n")
    env["peers"] = peers
else:
    while True:
        try:
            c = socket.create_connection(master, timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    env["source"] = c.getsockname()[0]
    c.sendall(f"{rank}\n".encode())
    env["go"] = c.makefile().readline().strip()
with open(os.path.join(os.environ["SPOTVISOR_CHECKPOINT_DIR"], "model"), "w") as f:
    f.write(f"trained by {member} rank {rank}\n")
with open(os.path.join(out, f"env-{member}.tmp"), "w") as f:
    json.dump(env, f)
os.rename(os.path.join(out, f"env-{member}.tmp"), os.path.join(out, f"env-{member}.json"))
'''

# Runs until SIGINT, and says when it got it.
SLEEPER = r'''
import os, signal, sys, time
out, member = os.environ["GANG_OUT"], os.environ["MEMBER"]
def on_int(signum, frame):
    with open(os.path.join(out, f"sigint-{member}"), "w") as f:
        f.write(repr(time.time()))
    sys.exit(130)
signal.signal(signal.SIGINT, on_int)
open(os.path.join(out, f"started-{member}"), "w").close()
while True:
    time.sleep(0.05)
'''


def torch_available():
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    return os.access(PYTHON, os.X_OK) and subprocess.run([PYTHON, "-c", probe], stdin=subprocess.DEVNULL).returncode == 0


class NetnsGangTestCase(unittest.TestCase):
    def make_gang(self, hosts):
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-gang-netns-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out)
        self.gang = NetnsGang(self.tmp, hosts=hosts, buckets=(BUCKET,))
        self.gang.start()  # SkipTest when this machine cannot
        self.addCleanup(self.gang.close)
        for m in self.gang.members:
            m.start_metadata()
        return self.gang

    def start(self, m, command, **overrides):
        """spotvisor run in m's namespace; the gang address is left to its metadata server."""
        sets = {
            "gang": GANG, "gang-size": str(len(self.gang.members)), "gang-etcd": self.gang.etcd_url,
            "bucket": f"gs://{BUCKET}/runs", "log-to": "stdout",
            "checkpoint-dir": os.path.join(self.tmp, f"ckpt-{m.name}"),
            "state-dir": os.path.join(self.tmp, f"state-{m.name}"), "sync-interval": "0", "sync-settle": "0s",
            "stop-timeout": "5s", "kill-timeout": "2s", "metadata-watch-timeout": "5s",
            "gang-form-timeout": "60s", "gang-lease-ttl": "3s",
            "env": f"MEMBER={m.name}\nGANG_OUT={self.out}\nOMP_NUM_THREADS=1",
            "on-exit": "poweroff", "shutdown-command": f"touch {self.tmp}/poweroff-{m.name}",
        }
        sets.update(overrides)
        args = ["run"]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        return m.spotvisor(args + ["--"] + command)

    def write_trainer(self, text):
        path = os.path.join(self.tmp, "trainer.py")
        with open(path, "w") as f:
            f.write(text)
        return path

    def out_file(self, name, timeout=30):
        path = os.path.join(self.out, name)
        wait_until(lambda: os.path.exists(path), timeout, f"{name} from a trainer")
        return path

    @staticmethod
    def lines(p, needle):
        return [e["message"] for e in list(p.events)
                if e.get("event") == "trainer.output" and needle in e.get("message", "")]

    def wait_line(self, p, needle, timeout, what):
        """The trainer output lines of p holding needle, once there is one; fails early,
        with p's last lines, if p exits first."""
        def seen():
            if self.lines(p, needle):
                return True
            if p.proc.poll() is not None:
                raise AssertionError(f"spotvisor exited {p.proc.returncode} before {what}:\n" + "".join(p.raw[-30:]))
            return False
        try:
            wait_until(seen, timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; {p.netns}'s last lines:\n" + "".join(p.raw[-30:])) from None
        return self.lines(p, needle)

    def objects(self):
        prefix = f"runs/{GANG}/"
        return {o["name"][len(prefix):]: o for o in self.gang.gcs.objects(BUCKET, prefix)}

    def checkpoint_object(self, path):
        """The bytes of the committed object whose spotvisor-path is path."""
        for name, o in self.objects().items():
            if name.startswith("checkpoints/") and o.get("metadata", {}).get("spotvisor-path") == path:
                return self.gang.gcs.get_object_bytes(BUCKET, f"runs/{GANG}/{name}")
        return None


class NetnsGangTest(NetnsGangTestCase):
    def test_three_namespaces_form_over_the_bridge_with_addresses_from_their_own_metadata(self):
        # vm-0 .100, vm-1 .9, vm-2 .10: by number the ranks are vm-1, vm-2, vm-0; by name
        # or as strings ("...10" < "...100" < "...9") they would be in another order.
        gang = self.make_gang(hosts=(100, 9, 10))
        trainer = self.write_trainer(TRAINER)
        by = {m.name: m for m in gang.members}
        procs = {m.name: self.start(m, [PYTHON, trainer]) for m in gang.members}
        order = sorted(gang.members, key=lambda m: [int(x) for x in m.ip.split(".")])
        self.assertEqual([m.name for m in order], ["vm-1", "vm-2", "vm-0"])
        ips = [m.ip for m in order]
        formed = {name: p.wait_event("gang.formed", timeout=30) for name, p in procs.items()}
        self.assertEqual(len({f["generation"] for f in formed.values()}), 1, formed)
        for name, p in procs.items():
            # Each spotvisor asked 169.254.169.254 in its own namespace: its own instance
            # name, and its own bridge address as the gang address.
            self.assertEqual(p.wait_event("cloud.detected")["instance"], name)
            self.assertEqual(p.wait_event("gang.joining")["ip"], by[name].ip)
            self.assertEqual(formed[name]["rank"], order.index(by[name]), formed[name])
        envs = {}
        for name in procs:
            with open(self.out_file(f"env-{name}.json")) as f:
                envs[name] = json.load(f)
        for rank, m in enumerate(order):
            e = envs[m.name]
            self.assertEqual(e["RANK"], str(rank), e)
            self.assertEqual(e["SPOTVISOR_GANG_RANK"], str(rank))
            self.assertEqual(e["NODE_RANK"], str(rank))
            self.assertEqual((e["WORLD_SIZE"], e["NNODES"], e["LOCAL_RANK"]), ("3", "3", "0"))
            self.assertEqual(e["MASTER_ADDR"], ips[0], "rank 0's bridge address")
            self.assertEqual(e["SPOTVISOR_GANG_HOSTS"], ",".join(ips))
            self.assertEqual(e["hostfile"], "".join(f"{a} slots=1\n" for a in ips))
            self.assertEqual(e["SPOTVISOR_RUN_ID"], GANG)
            if rank > 0:
                self.assertEqual(e["source"], m.ip, "it reached rank 0 from its own address")
                self.assertEqual(e["go"], "go")
        # Rank 0 bound MASTER_ADDR and saw each rank come from that rank's address, over the bridge.
        self.assertEqual(envs[order[0].name]["peers"], {"1": ips[1], "2": ips[2]})
        for name, p in procs.items():
            self.assertEqual(p.wait_exit(timeout=30), 0, "".join(p.raw[-20:]))
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
            self.assertTrue(os.path.exists(os.path.join(self.tmp, f"poweroff-{name}")), "on-exit ran everywhere")
        # Rank 0 (vm-1) committed its checkpoint and DONE to the fake GCS; the others never wrote.
        self.assertTrue(procs["vm-1"].find("done.written"))
        for name in ("vm-0", "vm-2"):
            self.assertTrue(procs[name].find("sync.follower"))
            self.assertFalse(procs[name].find("sync.complete"), "a follower never writes to the bucket")
        objects = self.objects()
        self.assertIn("DONE", objects)
        self.assertIn("manifest.json", objects)
        self.assertEqual(self.checkpoint_object("model"), b"trained by vm-1 rank 0\n")

    def test_a_member_cut_off_from_the_network_is_gone_for_the_others_and_stops_when_it_is_back(self):
        # Its bridge port goes down (packets dropped, nothing refused): the partition the
        # loopback tests cannot make. Lease TTL 3 s; gang-on-loss = stop.
        gang = self.make_gang(hosts=(9, 10, 11))
        trainer = self.write_trainer(SLEEPER)
        procs = [self.start(m, [PYTHON, trainer]) for m in gang.members]
        for m in gang.members:
            self.out_file(f"started-{m.name}")
        cut = time.time()
        gang.members[2].cut_off()
        # The others see its lease expire and stop together; they cannot tell it from a dead VM.
        for k in (0, 1):
            with open(self.out_file(f"sigint-vm-{k}")) as f:
                self.assertLess(float(f.read()) - cut, 3 + 7, "noticed within the lease TTL and a margin")
            self.assertEqual(procs[k].wait_exit(timeout=30), 130)
            self.assertEqual(procs[k].wait_event("gang.ended")["reason"], "member vm-2 is gone")
            self.assertEqual(procs[k].wait_event("run.end")["reason"], "gang-ended")
            self.assertTrue(os.path.exists(os.path.join(self.tmp, f"poweroff-vm-{k}")), "on-exit ran")
        # The cut-off member cannot tell the partition from etcd being down for everyone:
        # its trainer keeps running while it is cut off (docs/gang.md, split brain).
        procs[2].wait_event("gang.etcd_unavailable", timeout=30)
        self.assertIsNone(procs[2].proc.poll())
        self.assertFalse(os.path.exists(os.path.join(self.out, "sigint-vm-2")))
        self.assertFalse(procs[2].find("gang.ended"))
        # Back on the network it learns that its lease expired and the generation ended.
        gang.members[2].cut_off(False)
        self.assertEqual(procs[2].wait_exit(timeout=30), 130, "".join(procs[2].raw[-20:]))
        self.assertTrue(os.path.exists(os.path.join(self.out, "sigint-vm-2")))
        self.assertEqual(procs[2].wait_event("gang.ended")["reason"], "member vm-2 is gone")
        # (gang.lease_lost comes too, unless the watch saw the end before the keep-alive got through.)
        self.assertEqual(procs[2].wait_event("run.end")["reason"], "gang-ended")
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "poweroff-vm-2")), "on-exit ran")


class NetnsGangDdpTest(NetnsGangTestCase):
    """examples/ddp_train.py: gloo between three namespaces, over the bridge."""

    STEPS = 50

    @unittest.skipUnless(torch_available(), f"needs PyTorch in {PYTHON} (apt-get install python3-torch)")
    def test_ddp_rank0_preempted_all_stop_at_one_step_and_it_comes_back_to_resume_with_the_same_ranks(self):
        gang = self.make_gang(hosts=(9, 10, 11))
        cmd = [PYTHON, os.path.join(ROOT, "examples", "ddp_train.py"), "--steps", str(self.STEPS),
               "--step-time", "0.1", "--save-every", "0", "--timeout", "60"]
        sets = {"gang-on-loss": "wait", "gang-reform-timeout": "60s", "stop-timeout": "30s"}
        procs = [self.start(m, cmd, **sets) for m in gang.members]
        ips = [m.ip for m in gang.members]
        for k, p in enumerate(procs):
            self.assertEqual(p.wait_event("gang.formed", timeout=30)["rank"], k)
        for k, p in enumerate(procs):
            self.wait_line(p, f"ddp: rank={k} step=3 ", 60, f"rank {k} training")
            start = self.lines(p, "start_step=")[0]
            self.assertIn(f"ddp: rank={k} world=3 generation=", start)
            self.assertIn(f"master={ips[0]}:29500 resumed=0 start_step=0", start)
        # gloo's connections: in each namespace the trainer talks to the others' bridge addresses.
        for k, (m, p) in enumerate(zip(gang.members, procs)):
            pid = p.wait_event("trainer.start")["pid"]
            self.assertLessEqual(set(ips) - {m.ip}, m.tcp_peers(pid), f"rank {k}'s connections")

        # Rank 0's VM is preempted: every trainer gets SIGINT and they stop after one step.
        gang.members[0].metadata.set("instance/preempted", "TRUE")
        stopped = []
        for k, p in enumerate(procs):
            line = self.wait_line(p, "stopped step=", 30, f"rank {k} to stop")[0]
            stopped.append(int(line.split("stopped step=")[1].split()[0]))
            self.assertTrue(p.find("trainer.signal", signal="SIGINT"), f"vm-{k} sent its trainer SIGINT")
        self.assertEqual(len(set(stopped)), 1, f"every rank stops after the same step: {stopped}")
        step = stopped[0]
        self.assertLess(step, self.STEPS, "stopped before the end")
        self.assertTrue(self.lines(procs[0], f"ddp: rank=0 saved step={step} "))
        # Rank 0 commits its final checkpoint to the fake GCS inside its Spot window, then is gone.
        self.assertEqual(procs[0].wait_exit(timeout=60), 130, "".join(procs[0].raw[-20:]))
        self.assertEqual(procs[0].wait_event("run.end")["reason"], "preempted")
        committed = procs[0].wait_event("sync.complete")
        self.assertGreater(committed["sequence"], 0, committed)
        self.assertIsNotNone(self.checkpoint_object("ddp.ckpt"), sorted(self.objects()))
        self.assertNotIn("DONE", self.objects())
        for k in (1, 2):
            procs[k].wait_event("gang.reforming", timeout=30)
            self.assertIsNone(procs[k].proc.poll(), f"vm-{k} waits for the gang to form again")
            self.assertFalse(procs[k].find("run.end"))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "poweroff-vm-0")), "GCE takes a preempted VM itself")

        # The VM boots again in the same namespace: a fresh metadata server, a new spotvisor.
        gang.members[0].start_metadata()
        procs[0] = self.start(gang.members[0], cmd, **sets)
        formed = procs[0].wait_event("gang.formed", timeout=60)
        self.assertGreater(formed["generation"], 1, formed)
        for k in (1, 2):
            wait_until(lambda p=procs[k]: len(p.find("gang.formed")) >= 2, 30, f"vm-{k} in the new generation")
            self.assertEqual(procs[k].find("gang.formed")[1]["generation"], formed["generation"])
            self.assertEqual(procs[k].find("gang.formed")[1]["rank"], k, "the same ranks")
        self.assertEqual(formed["rank"], 0, "the same ranks")
        for k, p in enumerate(procs):
            self.assertEqual(p.wait_exit(timeout=90), 0, "".join(p.raw[-20:]))
            # Every member restored rank 0's commit before resuming (vm-0 at boot, the others once formed).
            self.assertEqual(p.find("restore.complete")[-1]["sequence"], committed["sequence"], f"vm-{k}")
            starts = self.lines(p, "start_step=")
            self.assertIn(f"ddp: rank={k} world=3 generation={formed['generation']} master={ips[0]}:29500 "
                          f"resumed=1 start_step={step} ", starts[-1])
            last = self.lines(p, f"ddp: rank={k} step=")[-1]
            self.assertEqual(int(last.split("step=")[1].split()[0]), self.STEPS, last)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed")
        resumed_steps = [int(l.split("step=")[1].split()[0]) for l in self.lines(procs[1], "ddp: rank=1 step=")]
        self.assertEqual(resumed_steps[resumed_steps.index(step) + 1], step + 1, "the resume continues at the next step")
        checksums = {self.lines(p, "done step=")[0].split("checksum=")[1] for p in procs}
        self.assertEqual(len(checksums), 1, f"DDP kept every rank's weights equal: {checksums}")
        self.assertIn("DONE", self.objects())


if __name__ == "__main__":
    unittest.main()
