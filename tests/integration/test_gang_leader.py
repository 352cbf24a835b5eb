"""gang-launch = leader (issue #16): only rank 0 runs the command, `mpiexec
--hostfile $SPOTVISOR_GANG_HOSTFILE`, which reaches the other members over
ssh with a key pair spotvisor makes for the generation and takes away after.

Every member is a network namespace on a test bridge (gang_netns.py) with
Debian's sshd of its own on its bridge address, port 2222, taking keys only
from a file of its own (TMP/sshd-vm-K/home/.ssh/authorized_keys), which the
test gives spotvisor as gang-ssh-authorized-keys. Debian's real OpenMPI
mpiexec runs a tiny Python program (no MPI library needed) that writes, per
MPI rank, where it ran: the source address towards the bridge, the network namespace's inode
and the chain of its parent processes (orted, sshd for a remote rank).

SshHarnessSelfCheck needs no leader mode: it sets the trust up by hand (a key,
the from= line, the plm_rsh_args spotvisor will give mpiexec) and proves the
harness: sshd in each namespace, from= telling the members apart, mpiexec's
ranks landing one per namespace, sshd gone after teardown.

Skipped (saying why) unless root with working `ip netns add`, OpenMPI's
mpiexec (openmpi-bin) and an sshd (gang_netns.find_sshd). Run with Debian's
/usr/bin/python3.
"""
import base64
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import unittest

import gang_netns
from gang_netns import NetnsGang, SSH_OPTIONS, SSHD_PORT, netns_inode, ssh_keygen
from harness import pid_alive, wait_until

PYTHON = "/usr/bin/python3"
MPIEXEC = shutil.which("mpiexec") or "/usr/bin/mpiexec"
BUCKET = "gang-bucket"
GANG = "leader-g1"
TAG_PREFIX = f"spotvisor-gang:{GANG}:"
# mpiexec refuses to run as root without these (the tests run as root).
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

# One MPI rank (argv: OUT GATEWAY MODE). Records where it runs, prints one line
# (mpiexec forwards it to the leader's output), then exits 0 ('exit'), or runs
# until OUT/stop appears ('wait'; a SIGINT or SIGTERM ends it too, noted in OUT).
RANK = r'''
import json, os, signal, socket, sys, time
out, gateway, mode = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((gateway, 9))  # no packet: only picks the route, so the source address is this member's
chain, pid = [], os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/comm") as f:
        chain.append(f.read().strip())
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
rec = {"rank": rank, "size": int(os.environ["OMPI_COMM_WORLD_SIZE"]), "addr": s.getsockname()[0],
       "netns": os.stat("/proc/self/ns/net").st_ino, "pid": os.getpid(), "ancestors": chain}
def stopped(signum, frame):
    with open(os.path.join(out, f"stopped-{rank}"), "w") as f:
        f.write(signal.Signals(signum).name)
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stopped)
signal.signal(signal.SIGTERM, stopped)
with open(os.path.join(out, f"rank-{rank}.tmp"), "w") as f:
    json.dump(rec, f)
os.rename(os.path.join(out, f"rank-{rank}.tmp"), os.path.join(out, f"rank-{rank}.json"))
print(f"mpi-rank={rank} addr={rec['addr']}", flush=True)
while mode == "wait" and not os.path.exists(os.path.join(out, "stop")):
    time.sleep(0.05)
'''

# Writes its environment to OUT/env-$MEMBER.json (argv: OUT), atomically.
NOTE_ENV = r'''
import json, os, sys
path = os.path.join(sys.argv[1], f"env-{os.environ['MEMBER']}.json")
with open(path + ".tmp", "w") as f:
    json.dump(dict(os.environ), f)
os.rename(path + ".tmp", path)
'''

# Lines spotvisor must leave alone in every member's authorized_keys: the user's own
# (a well-formed ed25519 public key nobody holds the private half of).
_BLOB = base64.b64encode(struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(range(32))).decode()
SOMEONE_ELSES = ("# the user's own keys: spotvisor must keep these lines byte for byte\n"
                 f"ssh-ed25519 {_BLOB} someone@laptop\n"
                 f'no-pty,from="192.0.2.7" ssh-ed25519 {_BLOB} someone@elsewhere\n')


def leader_skip_reason():
    """Why leader mode cannot be tested here (besides netns, which NetnsGang.start checks), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    if not os.access(PYTHON, os.X_OK):
        return f"needs {PYTHON}"
    if not os.access(MPIEXEC, os.X_OK):
        return "needs OpenMPI's mpiexec (apt-get install openmpi-bin)"
    return gang_netns.sshd_skip_reason()


def rsh_args(key, port=SSHD_PORT):
    """What spotvisor's leader sets OMPI_MCA_plm_rsh_args to."""
    return " ".join(["-i", key, "-p", str(port)] + SSH_OPTIONS)


def read(path):
    with open(path) as f:
        return f.read()


def gang_lines(path):
    """The lines of an authorized_keys file spotvisor put there for some gang's generation."""
    try:
        return [l for l in read(path).splitlines() if "spotvisor-gang:" in l]
    except FileNotFoundError:
        return []


def private_keys(d):
    """The files under d holding an OpenSSH private key."""
    found = []
    for root, _, files in os.walk(d):
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    if b"PRIVATE KEY" in f.read(4096):
                        found.append(path)
            except OSError:
                pass
    return found


class LeaderGangTestCase(unittest.TestCase):
    def setUp(self):
        reason = leader_skip_reason()
        if reason:
            self.skipTest(reason)

    def make_gang(self, hosts=(9, 10, 11)):
        """The gang, every member with its metadata server and its sshd running, every
        authorized_keys file holding someone else's lines only."""
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-gang-leader-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out)
        self.rank_script = os.path.join(self.tmp, "rank.py")
        with open(self.rank_script, "w") as f:
            f.write(RANK)
        self.note_env = os.path.join(self.tmp, "note_env.py")
        with open(self.note_env, "w") as f:
            f.write(NOTE_ENV)
        self.gang = NetnsGang(self.tmp, hosts=hosts, buckets=(BUCKET,))
        self.gang.start()  # SkipTest when this machine cannot
        self.addCleanup(self.gang.close)
        for m in self.gang.members:
            m.start_metadata()
            m.start_sshd()
            with open(m.authorized_keys, "w") as f:
                f.write(SOMEONE_ELSES)
            os.chmod(m.authorized_keys, 0o600)
        return self.gang

    def mpiexec_argv(self, n, mode, hostfile="$SPOTVISOR_GANG_HOSTFILE"):
        return (f"{MPIEXEC} --allow-run-as-root --hostfile {hostfile} -n {n} --map-by node "
                f"{PYTHON} {self.rank_script} {self.out} {self.gang.bridge_ip} {mode}")

    def leader_command(self, mode):
        """Rank 0's command: notes its environment (OUT/env-MEMBER.json), then execs mpiexec
        (so the trainer's pid is mpiexec's) with one rank per member. The same on every
        member (the gang refuses to form otherwise); only rank 0 may run it."""
        return ["/bin/sh", "-c", f"{PYTHON} {self.note_env} {self.out} && "
                f"exec {self.mpiexec_argv(len(self.gang.members), mode)}"]

    def start(self, m, command, **overrides):
        sets = {
            "gang": GANG, "gang-size": str(len(self.gang.members)), "gang-etcd": self.gang.etcd_url,
            "gang-launch": "leader", "gang-ssh-port": str(m.sshd_port),
            "gang-ssh-authorized-keys": m.authorized_keys,
            "bucket": f"gs://{BUCKET}/runs", "log-to": "stdout",
            "checkpoint-dir": os.path.join(self.tmp, f"ckpt-{m.name}"),
            "state-dir": self.state_dir(m), "sync-interval": "0", "sync-settle": "0s",
            "stop-timeout": "5s", "kill-timeout": "2s", "metadata-watch-timeout": "5s",
            "gang-form-timeout": "60s", "gang-lease-ttl": "3s", "gang-on-loss": "stop",
            "env": "\n".join([f"MEMBER={m.name}", f"GANG_OUT={self.out}"] + [f"{k}={v}" for k, v in ROOT_OK.items()]),
            "on-exit": "poweroff", "shutdown-command": f"touch {self.tmp}/poweroff-{m.name}",
        }
        sets.update(overrides)
        args = ["run"]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        return m.spotvisor(args + ["--"] + command)

    def start_all(self, mode):
        """Every member's spotvisor; returns them once every one started its trainer (the
        command or the placeholder), and the generation."""
        self.command = self.leader_command(mode)
        procs = [self.start(m, self.command) for m in self.gang.members]
        formed = self.wait_all(procs, "gang.formed")
        for k, f in enumerate(formed):
            self.assertEqual(f["rank"], k, f"{self.gang.members[k].name} by address: {f}")
        self.assertEqual(len({f["generation"] for f in formed}), 1, formed)
        self.wait_all(procs, "trainer.start")
        return procs, formed[0]["generation"]

    def wait_all(self, procs, name, timeout=30, **fields):
        """Each member's first `name` event; on failure, says what every member did."""
        try:
            return [p.wait_event(name, timeout, **fields) for p in procs]
        except AssertionError as e:
            raise AssertionError(f"{str(e)[:3000]}\n{self.story(procs)}") from None

    def story(self, procs):
        """Every member's events so far but the trainer's output, one line each, and the gang's
        keys in etcd: for failure messages."""
        skip = {"severity", "logging.googleapis.com/severity", "logging.googleapis.com/labels",
                "time", "message", "event"}
        text = []
        for p in procs:
            text.append(f"--- {p.netns} (exit {p.proc.poll()}):")
            for e in list(p.events):
                if e.get("event") != "trainer.output":
                    extra = json.dumps({k: v for k, v in e.items() if k not in skip})
                    text.append(f"  {e.get('time', '')[11:23]} {e.get('event')}: "
                                f"{e.get('message', '')[:300]} {extra[:300]}")
            if p.stderr:
                text.append(f"  stderr: {p.stderr[-1000:]}")
        text.append(f"--- etcd, /spotvisor/gang/{GANG}/:")
        for k, v in sorted(self.gang.etcd_prefix(f"/spotvisor/gang/{GANG}/").items()):
            text.append(f"  {k} = {v[:200]}")
        return "\n".join(text)

    def state_dir(self, m):
        return os.path.join(self.tmp, f"state-{m.name}")

    def out_file(self, name, timeout=30, procs=()):
        """OUT/name once it is there; fails early if one of procs exits first."""
        path = os.path.join(self.out, name)

        def there():
            if os.path.exists(path):
                return True
            for p in procs:
                if p.proc.poll() is not None:
                    raise AssertionError(f"{p.netns}'s spotvisor exited {p.proc.returncode} before {name}")
            return False
        try:
            wait_until(there, timeout, name)
        except AssertionError as e:
            lines = [l for p in procs for l in p.raw[-15:] if '"trainer.output"' in l]
            raise AssertionError(f"{e}\n{self.story(procs)}\n--- trainers' last output:\n" + "".join(lines)) from None
        return path

    def ranks(self, n, procs=(), timeout=45):
        """The records of MPI ranks 0..n-1, once all are there."""
        recs = []
        for k in range(n):
            with open(self.out_file(f"rank-{k}.json", timeout, procs)) as f:
                recs.append(json.load(f))
        return recs

    def assert_one_rank_per_member(self, recs):
        members = self.gang.members
        for k, (rec, m) in enumerate(zip(recs, members)):
            self.assertEqual(rec["size"], len(members), rec)
            self.assertEqual(rec["addr"], m.ip, f"MPI rank {k} runs on {m.name} (the hostfile's order)")
            self.assertEqual(rec["netns"], netns_inode(m.ns), f"MPI rank {k} runs in {m.ns}")
        self.assertEqual(len({r["netns"] for r in recs}), len(members), recs)
        # Rank 0 is mpiexec's own child on the leader; the others came in over ssh (sshd -> orted).
        self.assertIn("mpiexec", recs[0]["ancestors"], recs[0])
        self.assertNotIn("sshd", recs[0]["ancestors"], recs[0])
        for rec in recs[1:]:
            self.assertEqual(rec["ancestors"][0], "orted", rec)
            self.assertIn("sshd", rec["ancestors"], rec)
            self.assertNotIn("mpiexec", rec["ancestors"], rec)

    def objects(self):
        prefix = f"runs/{GANG}/"
        return {o["name"][len(prefix):]: o for o in self.gang.gcs.objects(BUCKET, prefix)}

    @staticmethod
    def output_lines(p, needle):
        return [e["message"] for e in list(p.events)
                if e.get("event") == "trainer.output" and needle in e.get("message", "")]


class SshHarnessSelfCheck(LeaderGangTestCase):
    """The harness alone, with the trust set up by hand the way leader mode will: passes
    without leader mode in spotvisor."""

    def test_sshd_per_namespace_from_restriction_and_mpiexec_across_the_members(self):
        with open("/etc/passwd", "rb") as f:
            machine_passwd = f.read()
        run_sshd_before = os.path.exists("/run/sshd")
        gang = self.make_gang()
        leader, host1, host2 = gang.members
        # The machine's own files are untouched by the sshds' private mount namespaces.
        with open("/etc/passwd", "rb") as f:
            self.assertEqual(f.read(), machine_passwd)
        self.assertEqual(os.path.exists("/run/sshd"), run_sshd_before)
        self.assertTrue(os.path.isdir("/run/netns"), "the root namespace's /run is not the sshds' tmpfs")

        key = os.path.join(self.tmp, "leader-key")
        pub = ssh_keygen(key, "leader").split()
        tag = f"{TAG_PREFIX}1"
        for m in (host1, host2):
            with open(m.authorized_keys, "a") as f:
                f.write(f'from="{leader.ip}",restrict {pub[0]} {pub[1]} {tag}\n')

        # From the leader's address the key works, and the session runs in the host's namespace.
        got = leader.ssh(key, host1.ip, "echo $SSH_CONNECTION; stat -L -c %i /proc/self/ns/net")
        self.assertEqual(got.returncode, 0, got.stderr + host1.sshd_log())
        conn, inode = got.stdout.split("\n")[:2]
        self.assertEqual(conn.split()[0], leader.ip)
        self.assertEqual(conn.split()[2:], [host1.ip, str(SSHD_PORT)])
        self.assertEqual(int(inode), netns_inode(host1.ns))
        self.assertIn(f"Accepted publickey for root from {leader.ip}", host1.sshd_log())
        # From another member's address the same key is refused: from= tells them apart.
        got = host2.ssh(key, host1.ip, "echo should-not-run")
        self.assertEqual(got.returncode, 255, got.stdout + got.stderr)
        self.assertNotIn("should-not-run", got.stdout)
        self.assertIn("Permission denied", got.stderr)
        wait_until(lambda: "not from a permitted host" in host1.sshd_log(), 10, "sshd's reason in its log")
        self.assertIn(f"ip={host2.ip}", host1.sshd_log())
        # The leader itself trusts nobody: its sshd refuses the key from anywhere.
        got = host1.ssh(key, leader.ip, "true")
        self.assertEqual(got.returncode, 255, got.stderr)

        # mpiexec as spotvisor's leader will run it: the hostfile, the key through plm_rsh_args.
        hostfile = os.path.join(self.tmp, "hostfile")
        with open(hostfile, "w") as f:
            f.write("".join(f"{m.ip} slots=1\n" for m in gang.members))
        env = dict(os.environ, OMPI_MCA_plm_rsh_args=rsh_args(key), **ROOT_OK)
        started = time.monotonic()
        mpi = subprocess.run([gang_netns.IP, "netns", "exec", leader.ns, "/bin/sh", "-c",
                              self.mpiexec_argv(3, "exit", hostfile)],
                             capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        took = time.monotonic() - started
        self.assertEqual(mpi.returncode, 0, f"{mpi.stdout}\n{mpi.stderr}\n{host1.sshd_log()}")
        self.assert_one_rank_per_member(self.ranks(3, timeout=5))
        self.assertEqual(sorted(l for l in mpi.stdout.splitlines() if l.startswith("mpi-rank=")),
                         [f"mpi-rank={k} addr={m.ip}" for k, m in enumerate(gang.members)])
        self.assertLess(took, 30, "mpiexec over ssh across the namespaces")
        for m in (host1, host2):
            self.assertIn(f"Accepted publickey for root from {leader.ip}", m.sshd_log())

        # Teardown: the janitor kills every sshd (and whatever it started) with its namespace.
        sshds = [m.sshd_proc.pid for m in gang.members]
        self.assertTrue(all(pid_alive(p) for p in sshds))
        gang.close()
        for pid in sshds:
            self.assertFalse(pid_alive(pid), f"sshd {pid} outlived the gang")


class LeaderModeTest(LeaderGangTestCase):
    """spotvisor's gang-launch = leader, end to end: three members, mpiexec on rank 0."""

    def leader_env(self):
        with open(self.out_file("env-vm-0.json")) as f:
            return json.load(f)

    def leader_key(self, env):
        """The private key spotvisor gave the leader's mpiexec, checked against the env it set."""
        key = env.get("SPOTVISOR_GANG_SSH_KEY")
        self.assertTrue(key, "SPOTVISOR_GANG_SSH_KEY in the leader's command's environment")
        ssh_dir = os.path.join(self.state_dir(self.gang.members[0]), "gang-ssh")
        self.assertEqual(os.path.commonpath([key, ssh_dir]), ssh_dir,
                         "the key is made in the leader's STATE_DIR/gang-ssh/")
        self.assertTrue(os.path.isfile(key), key)
        args = env.get("OMPI_MCA_plm_rsh_args", "").split()
        self.assertEqual(args[:4], ["-i", key, "-p", str(SSHD_PORT)], env.get("OMPI_MCA_plm_rsh_args"))
        for i in range(0, len(SSH_OPTIONS), 2):
            self.assertIn(SSH_OPTIONS[i + 1], args[4:][1::2], f"{SSH_OPTIONS[i + 1]} in OMPI_MCA_plm_rsh_args")
        return key

    def assert_placeholder_on_hosts(self, procs):
        """Rank 0's spotvisor started the command; the others started `spotvisor gang-host`."""
        self.assertEqual(procs[0].wait_event("trainer.start")["argv"], self.command)
        for k, p in enumerate(procs[1:], 1):
            argv = p.wait_event("trainer.start")["argv"]
            self.assertNotEqual(argv, self.command, f"vm-{k} (rank {k}) must not run the command")
            self.assertIn("gang-host", argv if isinstance(argv, list) else str(argv).split(), argv)

    def assert_command_ran_on_leader_only(self, procs):
        for k, p in enumerate(procs[1:], 1):
            self.assertFalse(os.path.exists(os.path.join(self.out, f"env-vm-{k}.json")), f"vm-{k} ran the command")
            self.assertFalse(self.output_lines(p, "mpi-rank="), f"vm-{k} ran mpiexec")

    def assert_trust_gone(self, key):
        """Every member's authorized_keys is back to the user's own lines; no private key anywhere."""
        for m in self.gang.members:
            self.assertEqual(read(m.authorized_keys), SOMEONE_ELSES, f"{m.name}'s authorized_keys after the end")
            self.assertEqual(private_keys(self.state_dir(m)), [], f"a private key left in {m.name}'s state dir")
        self.assertFalse(os.path.exists(key), f"{key} outlived its generation")

    def test_a_only_rank0_runs_mpiexec_its_ranks_reach_every_member_over_ssh_and_the_trust_goes_at_completion(self):
        gang = self.make_gang()
        leader = gang.members[0]
        procs, _ = self.start_all("exit")
        self.assert_placeholder_on_hosts(procs)
        recs = self.ranks(3, procs)
        self.assert_one_rank_per_member(recs)
        # Rank 0's spotvisor started mpiexec; the other ranks did not come from their
        # members' spotvisors but from sshd, for the leader's key.
        self.assertIn("spotvisor", recs[0]["ancestors"], recs[0])
        for rec in recs[1:]:
            self.assertNotIn("spotvisor", rec["ancestors"], rec)
        key = self.leader_key(self.leader_env())
        # mpiexec forwarded every rank's output to the leader's spotvisor.
        wait_until(lambda: len(self.output_lines(procs[0], "mpi-rank=")) == 3, 30, "the ranks' output at the leader")
        self.assertEqual(sorted(self.output_lines(procs[0], "mpi-rank=")),
                         [f"mpi-rank={k} addr={m.ip}" for k, m in enumerate(gang.members)])
        for m in gang.members[1:]:
            self.assertIn(f"Accepted publickey for root from {leader.ip}", m.sshd_log(), f"mpiexec's ssh into {m.name}")
        # The leader's command exited 0: the gang completes, everywhere.
        for k, p in enumerate(procs):
            self.assertEqual(p.wait_exit(timeout=60), 0, f"vm-{k}:\n" + "".join(p.raw[-30:]) + p.stderr)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed", f"vm-{k}")
            self.assertIn("completed", p.wait_event("gang.ended")["reason"])
            self.assertTrue(os.path.exists(os.path.join(self.tmp, f"poweroff-vm-{k}")), "on-exit ran everywhere")
        self.assertIn("DONE", self.objects())
        self.assertTrue(procs[0].find("done.written"))
        self.assert_command_ran_on_leader_only(procs)
        self.assert_trust_gone(key)

    def test_b_a_host_trusts_the_leaders_key_from_the_leaders_address_only_while_the_gang_runs(self):
        gang = self.make_gang()
        leader, host1, host2 = gang.members
        procs, generation = self.start_all("wait")
        self.assert_placeholder_on_hosts(procs)
        self.ranks(3, procs)  # every rank runs: the trust is in place
        key = self.leader_key(self.leader_env())
        st = os.stat(key)
        self.assertEqual(st.st_mode & 0o777, 0o600, oct(st.st_mode))
        pub = subprocess.run([gang_netns.SSH_KEYGEN, "-y", "-f", key], capture_output=True, text=True, timeout=30,
                             check=True, stdin=subprocess.DEVNULL).stdout.split()
        self.assertEqual(pub[0], "ssh-ed25519")
        line = re.compile(r'from="(?P<ip>[^"]+)",restrict ssh-ed25519 (?P<key>\S+) (?P<tag>\S+)')
        for m in (host1, host2):
            lines = gang_lines(m.authorized_keys)
            self.assertEqual(len(lines), 1, f"{m.name}: {lines}")
            got = line.fullmatch(lines[0])
            self.assertTrue(got, lines[0])
            self.assertEqual(got["ip"], leader.ip, "from= the leader's bridge address")
            self.assertEqual(got["key"], pub[1], "the leader's public key of this generation")
            self.assertEqual(got["tag"], f"{TAG_PREFIX}{generation}")
            others = [l for l in read(m.authorized_keys).splitlines(keepends=True) if "spotvisor-gang:" not in l]
            self.assertEqual("".join(others), SOMEONE_ELSES, "the user's own lines are kept")
            self.assertEqual(private_keys(self.state_dir(m)), [],
                             f"the private key is on the leader only, not on {m.name}")
        self.assertEqual(read(leader.authorized_keys), SOMEONE_ELSES, "the leader trusts nobody")
        # The key gets in from the leader's address...
        got = leader.ssh(key, host1.ip, "echo in")
        self.assertEqual((got.returncode, got.stdout.strip()), (0, "in"), got.stderr + host1.sshd_log())
        # ...and not from another member's: sshd refuses it for from=.
        got = host2.ssh(key, host1.ip, "echo should-not-run")
        self.assertEqual(got.returncode, 255, got.stdout + got.stderr)
        self.assertNotIn("should-not-run", got.stdout)
        self.assertIn("Permission denied", got.stderr)
        wait_until(lambda: "not from a permitted host" in host1.sshd_log(), 10, "sshd's from= refusal in its log")
        self.assertIn(f"ip={host2.ip}", host1.sshd_log())
        # The ranks finish: the gang completes and the trust goes.
        with open(os.path.join(self.out, "stop"), "w"):
            pass
        for k, p in enumerate(procs):
            self.assertEqual(p.wait_exit(timeout=60), 0, f"vm-{k}:\n" + "".join(p.raw[-30:]) + p.stderr)
            self.assertEqual(p.wait_event("run.end")["reason"], "completed", f"vm-{k}")
        self.assert_trust_gone(key)

    def test_c_a_host_member_preempted_stops_the_leaders_mpiexec_and_everyone_and_revokes_the_key(self):
        gang = self.make_gang()
        leader, host1, host2 = gang.members
        procs, _ = self.start_all("wait")
        self.assert_placeholder_on_hosts(procs)
        recs = self.ranks(3, procs)
        key = self.leader_key(self.leader_env())
        kept = os.path.join(self.tmp, "kept-leader-key")  # to show the revoked key no longer gets in
        shutil.copyfile(key, kept)
        os.chmod(kept, 0o600)
        for m in (host1, host2):
            self.assertEqual(len(gang_lines(m.authorized_keys)), 1, m.name)
            got = leader.ssh(kept, m.ip, "echo in")
            self.assertEqual((got.returncode, got.stdout.strip()), (0, "in"), f"{m.name} before: {got.stderr}")
        mpiexec = procs[0].wait_event("trainer.start")["pid"]
        self.assertTrue(pid_alive(mpiexec))

        host1.metadata.set("instance/preempted", "TRUE")
        self.assertTrue(procs[0].wait_event("trainer.signal", signal="SIGINT", timeout=30), "mpiexec got SIGINT")
        for p in procs:
            p.wait_exit(timeout=60)
        self.assertEqual(procs[1].wait_event("run.end")["reason"], "preempted")
        for k in (0, 2):
            self.assertEqual(procs[k].wait_event("run.end")["reason"], "gang-ended", f"vm-{k}")
            self.assertIn("vm-1 (rank 1): preempted", procs[k].wait_event("gang.ended")["reason"])
        # mpiexec and every MPI rank, the remote ones under sshd included, are gone.
        self.assertFalse(pid_alive(mpiexec))
        wait_until(lambda: not any(pid_alive(r["pid"]) for r in recs), 30, "every MPI rank to end")
        # gang-on-loss = stop: the others run on-exit; GCE takes the preempted VM itself.
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "poweroff-vm-0")))
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "poweroff-vm-2")))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "poweroff-vm-1")))
        self.assertNotIn("DONE", self.objects())
        # The trust is gone on every member, the preempted one included, and really refused.
        self.assert_trust_gone(key)
        for m in (host1, host2):
            got = leader.ssh(kept, m.ip, "echo should-not-run")
            self.assertEqual(got.returncode, 255, f"{m.name}: {got.stdout}{got.stderr}")
            self.assertNotIn("should-not-run", got.stdout)


if __name__ == "__main__":
    unittest.main()
