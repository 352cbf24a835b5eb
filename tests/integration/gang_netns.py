#!/usr/bin/python3
"""A gang of "VMs" as Linux network namespaces on a test bridge (issue #16).

On loopback (test_gang.py) the members share one network stack: 127.0.0.K
all belong to every process, so nothing shows that a member really uses its
own address or reaches the others over a network. Here every member is a
network namespace with one interface, `eth0`, on a bridge of its own:

    root namespace (the test)                       namespace svg<PID>-vm-K
    bridge svb<PID>  10.A.B.1/24 ──veth svv<PID>-K── eth0  10.A.B.(host part)/24
      fake GCS (in-process) on 10.A.B.1:PORT              lo  127.0.0.1, 169.254.169.254/32
                                                          fake metadata (in-process) on 169.254.169.254:80
    namespace svg<PID>-etcd: eth0 10.A.B.2, a real etcd on 10.A.B.2:2379
                                                          spotvisor, via `ip netns exec`

- **Metadata**: each member has its own FakeMetadataServer at the real GCE
  address, 169.254.169.254:80, *inside its namespace* (the address is on the
  namespace's lo), so spotvisor runs with no GCE_METADATA_HOST at all, as on
  GCE. The server lives in the test process (the test flips `preempted` and
  reads its log directly): its listening socket is opened by a thread that
  has entered the namespace with setns(2) for that moment (`in_netns`); the
  serving threads then accept on that socket wherever they run. Its answer
  for instance/network-interfaces/0/ip is the member's bridge address.
  (Fake faults that re-open the listener later, 'refuse' with a duration,
  would re-bind it in the root namespace: do not use them here.)
- **etcd**: Debian's real etcd in a namespace of its own (its "small standard
  VM"), on 10.A.B.2:2379; members reach it over the bridge only.
- **Bucket**: the project's fake GCS in the test process, bound to the
  bridge's address 10.A.B.1 (the members' way out, like Private Google
  Access); spotvisor finds it through STORAGE_EMULATOR_HOST=10.A.B.1:PORT.
- **Hostname**: `ip netns exec` bind-mounts /etc/netns/NAME/hosts over
  /etc/hosts; each member's maps the machine's hostname to its bridge
  address, as GCE's guest environment does for a VM's internal IP. gloo
  (torch.distributed) binds the address the hostname resolves to: with the
  machine's own /etc/hosts (hostname -> 127.0.0.1) every rank would offer
  its peers a loopback address and the gang would never connect.
- **Names**: everything carries the test process's pid (namespaces
  `svg<PID>-*`, links `svb<PID>`, `svv<PID>-K`) and the /24 is chosen under
  a lock among those no route or address on the machine overlaps, so
  parallel ctest runs do not collide.
- **Cleanup always runs**: a janitor process (this file, `--janitor`),
  detached from the test's process tree before any resource exists, holds a
  pipe from the test. When the pipe closes (teardown, or the test process
  dying in any way, SIGKILL included) it kills every process in the
  namespaces, deletes them, the links and /etc/netns/NAME. The resources are
  written to /run/spotvisor-netns/PID.json *before* each is created; a run
  whose test process and janitor are both gone is swept by the next run.
- **sshd** (gang-launch = leader; only when a test asks,
  `Member.start_sshd()`): Debian's OpenSSH sshd in the member's namespace,
  listening on its bridge address only (port 2222), with its own host key,
  config, pid file and authorized_keys under TMP/sshd-vm-K/ (the latter as
  home/.ssh/authorized_keys, the shape spotvisor's gang-ssh-authorized-keys
  wants): the machine's own sshd, keys and /root/.ssh are never used. It
  needs the privilege-separation user `sshd` and the dir /run/sshd, which
  the machine may not have; a private mount namespace gives it both without
  changing the machine (checked by hand with Debian 12's 9.2 sshd first):
    ip netns exec NS unshare --mount --propagation private sh -c 'mount --bind
    DIR/passwd /etc/passwd && mount --bind DIR/shadow /etc/shadow &&
    mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 0755 /run/sshd &&
    exec SSHD -D -e -f DIR/sshd_config'
  DIR/passwd is /etc/passwd plus an `sshd` line; DIR/shadow holds only
  `root:*` and `sshd:*` (with UsePAM no, sshd refuses an account whose
  shadow entry is locked with '!', as root's may be; no password hash is
  ever copied). Every step execs, so the Popen's pid is sshd's own; what it
  starts for a login (mpiexec's orted and ranks) runs in the member's
  network namespace and that private mount namespace (where /run is the
  empty tmpfs). `from="IP"` in authorized_keys then tells the members apart
  by their bridge addresses. The janitor kills sshd and its sessions with
  everything else in the namespace; the mount namespace goes with them.
  The sshd is `find_sshd()`'s: $SPOTVISOR_SSHD, else Debian's
  /usr/sbin/sshd (openssh-server installed), else the copy
  scripts/install-deps.sh extracts from openssh-server's .deb without
  installing it (which would start the machine's own sshd), SSHD_CACHE;
  with none, `sshd_skip_reason()` says so.

Needs root, iproute2 and `ip netns add` working (else `NetnsGang.start`
raises unittest.SkipTest saying which is missing) and etcd (etcd-server; no
skip: scripts/install-deps.sh installs it). Run with Debian's /usr/bin/python3
(fake_gcs needs python3-crc32c).
"""
import base64
import contextlib
import ctypes
import fcntl
import glob
import ipaddress
import json
import os
import pwd
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import ROOT, Spotvisor, wait_until, WAIT  # noqa: E402,F401

sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))

RUN_DIR = "/run/spotvisor-netns"
LOCK = os.path.join(RUN_DIR, "lock")
IP = shutil.which("ip") or "/usr/sbin/ip"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
METADATA_IP = "169.254.169.254"
ETCD_PORT = 2379
CLONE_NEWNET = 0x40000000
SSHD_PORT = 2222
# Where scripts/install-deps.sh extracts Debian's openssh-server (`apt-get download` + `dpkg -x`).
SSHD_CACHE = "/var/cache/spotvisor-test/openssh-server/usr/sbin/sshd"
SSH = shutil.which("ssh") or "/usr/bin/ssh"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
# The ssh options spotvisor's leader gives mpiexec (OMPI_MCA_plm_rsh_args), less -i and -p.
SSH_OPTIONS = ["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null"]
_libc = ctypes.CDLL(None, use_errno=True)


# ------------------------------------------------------------------ plumbing
def ip(*args, check=True, timeout=30):
    """Runs `ip ARGS`; raises with its stderr when check and it fails."""
    out = subprocess.run([IP, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return out


def proc_start(pid):
    """The start time of pid (clock ticks since boot), or None: tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(ident):
    """ident is [pid, start time]: that very process still exists."""
    return bool(ident) and ident[1] is not None and proc_start(ident[0]) == ident[1]


def _setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def in_netns(name):
    """The calling thread (only it) is in network namespace `name` for the block.

    Sockets opened in the block belong to that namespace for good, and
    threads started in it start there too.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(target)
    finally:
        os.close(own)


def netns_pids(name):
    out = ip("netns", "pids", name, check=False)
    if out.returncode != 0:
        return []
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def cleanup(state, log=lambda msg: None):
    """Removes what state names: processes in its namespaces, the namespaces,
    links and /etc/netns dirs. Idempotent; returns the problems left."""
    problems = []
    spaces = state.get("netns", [])
    for ns in spaces:
        deadline = time.monotonic() + 10
        while True:
            pids = netns_pids(ns)
            if not pids:
                break
            if time.monotonic() > deadline:
                problems.append(f"{ns}: processes survive SIGKILL: {pids}")
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            log(f"killed {pids} in {ns}")
            time.sleep(0.05)  # a bounded loop (deadline above) while the kernel reaps them
    for ns in spaces:
        out = ip("netns", "del", ns, check=False)
        if out.returncode != 0 and "No such file" not in out.stderr:
            problems.append(f"ip netns del {ns}: {out.stderr.strip()}")
    for link in state.get("links", []):
        out = ip("link", "del", link, check=False)
        if out.returncode != 0 and "Cannot find device" not in out.stderr:
            problems.append(f"ip link del {link}: {out.stderr.strip()}")
    for d in state.get("etc", []):
        if d.startswith("/etc/netns/svg"):
            shutil.rmtree(d, ignore_errors=True)
            if os.path.exists(d):
                problems.append(f"{d} is still there")
    try:
        os.rmdir("/etc/netns")  # only when empty: it is not ours otherwise
    except OSError:
        pass
    left = set(ip("netns", "list", check=False).stdout.split())
    problems += [f"namespace {ns} is still there" for ns in spaces if ns in left]
    problems += [f"link {link} is still there" for link in state.get("links", [])
                 if ip("link", "show", link, check=False).returncode == 0]
    return problems


def sweep_stale(log=lambda msg: None):
    """Cleans up after runs whose test process and janitor are both gone (call under LOCK)."""
    for path in glob.glob(os.path.join(RUN_DIR, "*.json")):
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if alive(state.get("owner")) or alive(state.get("janitor")):
            continue
        log(f"sweeping the leftovers of {path}: {state}")
        if not cleanup(state, log):
            os.remove(path)
            with contextlib.suppress(OSError):
                os.remove(path + ".log")


def janitor_main(state_path):
    """`gang_netns.py --janitor STATE`: detaches (double fork), says 'ready' on
    stdout, waits for EOF on stdin, cleans up what STATE names, says 'clean'
    (or the problems) and exits, closing stdout."""
    if os.fork() > 0:
        os._exit(0)  # the test reaps this one; the janitor goes on outside its process tree
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    class Told(Exception):
        pass

    def told(signum, frame):
        raise Told()
    signal.signal(signal.SIGTERM, told)  # told to go: clean up first
    logf = open(state_path + ".log", "a", buffering=1)

    def log(msg):
        logf.write(f"{time.strftime('%H:%M:%S')} janitor {os.getpid()}: {msg}\n")

    me = [os.getpid(), proc_start(os.getpid())]
    sys.stdout.write(json.dumps(me) + "\n")
    sys.stdout.flush()
    try:
        while os.read(0, 4096):
            pass
    except (OSError, Told):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with open(state_path) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        log(f"no state: {e}")
        state = {}
    problems = cleanup(state, log)
    log(f"cleaned {state}: {problems or 'ok'}")
    if not problems:
        with contextlib.suppress(OSError):
            os.remove(state_path)
        with contextlib.suppress(OSError):
            os.remove(state_path + ".log")
    try:
        sys.stdout.write(("clean" if not problems else "problems: " + "; ".join(problems)) + "\n")
        sys.stdout.flush()
    except OSError:
        pass
    os._exit(0)


def skip_reason():
    """Why this machine cannot run the harness, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, a bridge)"
    if not os.access(IP, os.X_OK):
        return "needs iproute2's ip (apt-get install iproute2)"
    probe = f"svgprobe{os.getpid()}"
    out = ip("netns", "add", probe, check=False)
    if out.returncode != 0:
        return f"`ip netns add` fails here: {out.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def find_sshd():
    """The sshd to run in the namespaces: $SPOTVISOR_SSHD, Debian's /usr/sbin/sshd, or
    the copy install-deps.sh extracts (SSHD_CACHE); None when there is none.
    Absolute: sshd re-executes itself for every connection and insists on that."""
    chosen = os.environ.get("SPOTVISOR_SSHD")
    for path in ([chosen] if chosen else ["/usr/sbin/sshd", SSHD_CACHE]):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def sshd_skip_reason():
    """Why sshd cannot run in the members' namespaces here, or None."""
    if not find_sshd():
        if os.environ.get("SPOTVISOR_SSHD"):
            return f"SPOTVISOR_SSHD={os.environ['SPOTVISOR_SSHD']} is not an executable sshd"
        return (f"needs Debian's sshd: /usr/sbin/sshd (openssh-server), or the copy scripts/install-deps.sh "
                f"extracts to {SSHD_CACHE}, or SPOTVISOR_SSHD=PATH")
    for tool, package in ((SSH, "openssh-client"), (SSH_KEYGEN, "openssh-client"), (UNSHARE, "util-linux")):
        if not os.access(tool, os.X_OK):
            return f"needs {tool} ({package})"
    return None


def ssh_keygen(path, comment="spotvisor-test"):
    """A fresh ed25519 key pair path and path.pub (no passphrase); returns the public key line."""
    for f in (path, path + ".pub"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
                   check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    with open(path + ".pub") as f:
        return f.read().strip()


def netns_inode(name):
    """The inode of network namespace `name`: equals os.stat('/proc/PID/ns/net').st_ino of its processes."""
    return os.stat(f"/run/netns/{name}").st_ino


# ------------------------------------------------------------------ the gang
class NsSpotvisor(Spotvisor):
    """harness.Spotvisor, started in a network namespace through `ip netns exec`
    (which execs: the pid is spotvisor's own)."""

    _patch = threading.Lock()

    def __init__(self, netns, args, env):
        # harness.Spotvisor runs [harness.SPOTVISOR] + args: for this one start
        # it runs `ip netns exec NAME <spotvisor> ARGS` instead.
        with NsSpotvisor._patch:
            binary = harness.SPOTVISOR
            harness.SPOTVISOR = IP
            try:
                super().__init__(["netns", "exec", netns, binary] + list(args), env)
            finally:
                harness.SPOTVISOR = binary
        self.netns = netns


class Member:
    """One "VM": a namespace, its address on the bridge, its metadata server, its spotvisors."""

    def __init__(self, gang, k, host):
        self.gang, self.k = gang, k
        self.name = f"vm-{k}"
        self.ns = f"{gang.prefix}-{self.name}"
        self.veth = f"svv{gang.pid}-{k}"
        self.ip = str(gang.net.network_address + host)
        self.metadata = None
        self.spotvisors = []
        self.sshd_proc = None  # start_sshd()
        self.sshd_dir = os.path.join(gang.tmp, f"sshd-{self.name}")
        # sshd's AuthorizedKeysFile, shaped like a user's own (spotvisor's gang-ssh-authorized-keys
        # must end in /.ssh/authorized_keys: it edits DIR/.ssh as it would ~/.ssh).
        self.authorized_keys = os.path.join(self.sshd_dir, "home", ".ssh", "authorized_keys")
        self.sshd_port = SSHD_PORT

    def start_metadata(self):
        """A fresh metadata server (a new boot of this VM), at 169.254.169.254:80 in the namespace."""
        from fake_metadata import FakeMetadataServer
        if self.metadata:
            self.metadata.stop()
        srv = FakeMetadataServer(host=METADATA_IP, port=80, instance_name=self.name)
        srv.set("instance/network-interfaces/0/ip", self.ip)
        with in_netns(self.ns):
            srv.start()
        self.metadata = srv
        return srv

    def spotvisor(self, args, env=None):
        e = {
            # Nothing of the test's environment may point spotvisor elsewhere:
            # the metadata server is the namespace's 169.254.169.254 (empty = unset).
            "GCE_METADATA_HOST": "", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "",
            "STORAGE_EMULATOR_HOST": f"{self.gang.bridge_ip}:{self.gang.gcs.port}",
        }
        e.update(env or {})
        p = NsSpotvisor(self.ns, args, e)
        self.spotvisors.append(p)
        return p

    # -------------------------------------------------------------- sshd
    def start_sshd(self, port=SSHD_PORT, authorized_keys=None):
        """Debian's sshd in this namespace on IP:port (see the module docstring), up and
        accepting when this returns. Its log is sshd_log(); self.authorized_keys is the
        only file it takes keys from (the caller writes it, or has spotvisor write it:
        gang-ssh-authorized-keys). Raises unittest.SkipTest when there is no sshd."""
        reason = sshd_skip_reason()
        if reason:
            raise unittest.SkipTest(reason)
        if self.sshd_proc is not None and self.sshd_proc.poll() is None:
            raise AssertionError(f"{self.name}: sshd runs already")
        sshd = find_sshd()
        d = self.sshd_dir
        os.makedirs(d, mode=0o700, exist_ok=True)
        if authorized_keys:
            self.authorized_keys = authorized_keys
        os.makedirs(os.path.dirname(self.authorized_keys), mode=0o700, exist_ok=True)
        self.sshd_port = port
        with open("/etc/passwd") as f:
            passwd = f.read()
        if not passwd.endswith("\n"):
            passwd += "\n"
        if not any(line.startswith("sshd:") for line in passwd.splitlines()):
            used = {p.pw_uid for p in pwd.getpwall()}
            uid = next(u for u in range(64999, 60000, -1) if u not in used)
            passwd += f"sshd:x:{uid}:65534:sshd privilege separation:/run/sshd:/usr/sbin/nologin\n"
        with open(os.path.join(d, "passwd"), "w") as f:
            f.write(passwd)
        with open(os.path.join(d, "shadow"), "w") as f:
            f.write("root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\n")
        os.chmod(os.path.join(d, "shadow"), 0o600)
        host_key = os.path.join(d, "ssh_host_ed25519_key")
        if not os.path.exists(host_key):
            ssh_keygen(host_key, f"host key of {self.name}")
        config = os.path.join(d, "sshd_config")
        with open(config, "w") as f:
            f.write(f"""# sshd of "VM" {self.name} (gang_netns.py): nothing of the machine's own sshd
Port {port}
ListenAddress {self.ip}
AddressFamily inet
HostKey {host_key}
PidFile {d}/sshd.pid
AuthorizedKeysFile {self.authorized_keys}
AuthorizedPrincipalsFile none
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
PermitUserEnvironment no
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 50
LogLevel VERBOSE
""")
        q = shlex.quote
        script = (f"mount --bind {q(d)}/passwd /etc/passwd && mount --bind {q(d)}/shadow /etc/shadow && "
                  f"mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 0755 /run/sshd && "
                  f"exec {q(sshd)} -D -e -f {q(config)}")
        log = open(os.path.join(d, "sshd.log"), "ab")
        try:
            self.sshd_proc = subprocess.Popen(
                [IP, "netns", "exec", self.ns, UNSHARE, "--mount", "--propagation", "private", "/bin/sh", "-c", script],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()

        def accepting():  # from the root namespace, over the bridge: sshd's banner
            if self.sshd_proc.poll() is not None:
                raise AssertionError(f"{self.name}'s sshd exited {self.sshd_proc.returncode}:\n{self.sshd_log()}")
            try:
                with socket.create_connection((self.ip, port), timeout=1) as s:
                    s.settimeout(2)
                    return s.recv(64).startswith(b"SSH-2.0-")
            except OSError:
                return False
        wait_until(accepting, WAIT, f"{self.name}'s sshd accepting on {self.ip}:{port}")
        return self.sshd_proc

    def sshd_log(self):
        try:
            with open(os.path.join(self.sshd_dir, "sshd.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop_sshd(self):
        if self.sshd_proc is not None:
            if self.sshd_proc.poll() is None:
                self.sshd_proc.kill()
            self.sshd_proc.wait(WAIT)

    def ssh_argv(self, key, target, command, port=None, options=()):
        """`ip netns exec NS ssh ...`: ssh from this member (its bridge address) to target as root,
        with only `key`, no user or system ssh config, spotvisor's options."""
        port = port or self.sshd_port
        return [IP, "netns", "exec", self.ns, SSH, "-F", "/dev/null", "-i", key, "-p", str(port), *SSH_OPTIONS,
                "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", *options, f"root@{target}", command]

    def ssh(self, key, target, command, port=None, timeout=30):
        """Runs command over ssh from this member to target; the CompletedProcess (text)."""
        return subprocess.run(self.ssh_argv(key, target, command, port), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def cut_off(self, cut=True):
        """Pulls (or plugs back) this VM's cable: its bridge port goes down, so packets
        to and from it are dropped (no reset, no 'unreachable'): a network partition."""
        ip("link", "set", self.veth, "down" if cut else "up")

    def tcp_peers(self, pid):
        """The remote addresses of process pid's established TCP connections, seen in this namespace."""
        out = subprocess.run([IP, "netns", "exec", self.ns, "ss", "-Htnp", "state", "established"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        peers = set()
        for line in out.stdout.splitlines():
            cols = line.split()
            if f"pid={pid}," in line and len(cols) >= 4:
                peers.add(cols[3].rsplit(":", 1)[0].strip("[]"))
        return peers


class NetnsGang:
    """The bridge, the etcd namespace, N member namespaces and the fake GCS.

    gang = NetnsGang(tmp, hosts=(9, 10, 11)).start()  # members vm-0.. at 10.A.B.9, .10, .11
    gang.members[0].start_metadata(); gang.members[0].spotvisor(["run", ...])
    gang.close()  # always (addCleanup): kills, deletes, waits for the janitor
    """

    def __init__(self, tmp, hosts=(10, 11, 12), buckets=("gang-bucket",)):
        self.tmp = tmp
        self.pid = os.getpid()
        self.prefix = f"svg{self.pid}"
        self.bridge = f"svb{self.pid}"
        self.state_path = os.path.join(RUN_DIR, f"{self.pid}.json")
        self.hosts = hosts
        self.buckets = buckets
        self.state = {"owner": [self.pid, proc_start(self.pid)], "netns": [], "links": [], "etc": []}
        self.janitor = None
        self.members = []
        self.etcd_proc = None
        self.gcs = None
        self.net = None

    # -------------------------------------------------------------- state
    def _record(self, kind, value):
        """Written down before it is created: the janitor removes what the file names."""
        self.state[kind].append(value)
        self._save()

    def _save(self):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.rename(tmp, self.state_path)

    def _start_janitor(self):
        self.janitor = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--janitor", self.state_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.janitor.wait(WAIT)  # the first fork exits at once; its child is the janitor
        ready, _, _ = select.select([self.janitor.stdout], [], [], WAIT)
        if not ready:
            raise AssertionError("the janitor did not start")
        self.state["janitor"] = json.loads(self.janitor.stdout.readline())
        self._save()

    def _pick_subnet(self):
        """A /24 in 10.213.0.0/16 that nothing on the machine overlaps (other runs' bridges included)."""
        taken = []
        for fam in ("addr", "route"):
            out = ip("-j", "-4", fam, "show", check=False)
            for entry in json.loads(out.stdout or "[]"):
                if fam == "addr":
                    for a in entry.get("addr_info", []):
                        taken.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
                elif entry.get("dst", "default") != "default":
                    taken.append(ipaddress.ip_network(entry["dst"], strict=False))
        for i in range(256):
            net = ipaddress.ip_network(f"10.213.{(self.pid + i) % 256}.0/24")
            if not any(net.overlaps(t) for t in taken):
                return net
        raise AssertionError(f"no free /24 in 10.213.0.0/16: {taken}")

    # -------------------------------------------------------------- setup
    def start(self):
        reason = skip_reason()
        if reason:
            raise unittest.SkipTest(reason)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self):
        os.makedirs(RUN_DIR, exist_ok=True)
        self._start_janitor()
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sweep_stale()
            self.net = self._pick_subnet()
            self.bridge_ip = str(self.net.network_address + 1)
            self._record("links", self.bridge)
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        self.etcd_ip = str(self.net.network_address + 2)
        self._namespace(f"{self.prefix}-etcd", f"svv{self.pid}-e", self.etcd_ip)
        self._start_etcd()
        for k, host in enumerate(self.hosts):
            m = Member(self, k, host)
            self._namespace(m.ns, m.veth, m.ip)
            ip("-n", m.ns, "addr", "add", f"{METADATA_IP}/32", "dev", "lo")
            self.members.append(m)
        from fake_gcs import FakeGcsServer
        self.gcs = FakeGcsServer(host=self.bridge_ip, buckets=self.buckets).start()

    def _namespace(self, ns, veth, address):
        """A namespace whose eth0 is on the bridge at address/24, its own hosts file, lo up."""
        etc = f"/etc/netns/{ns}"
        self._record("etc", etc)
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                    f"{address}\t{socket.gethostname()}\n")
        self._record("netns", ns)
        ip("netns", "add", ns)
        self._record("links", veth)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", self.bridge, "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")

    def _start_etcd(self):
        ns = f"{self.prefix}-etcd"
        data = os.path.join(self.tmp, "etcd")
        os.makedirs(data, exist_ok=True)
        self.etcd_url = f"http://{self.etcd_ip}:{ETCD_PORT}"
        peer = "http://127.0.0.1:2380"
        self.etcd_log = open(os.path.join(data, "etcd.log"), "ab")
        self.etcd_proc = subprocess.Popen(
            [IP, "netns", "exec", ns, ETCD, "--name=gang-etcd", f"--data-dir={data}/data",
             f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=gang-etcd={peer}", "--logger=zap", "--log-outputs=stderr"],
            stdout=self.etcd_log, stderr=self.etcd_log, stdin=subprocess.DEVNULL)

        def healthy():  # asked from the root namespace: over the bridge
            if self.etcd_proc.poll() is not None:
                raise AssertionError(f"etcd exited {self.etcd_proc.returncode}; see {data}/etcd.log")
            try:
                with socket.create_connection((self.etcd_ip, ETCD_PORT), timeout=1) as s:
                    s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                    return b'"health":"true"' in s.recv(4096)
            except OSError:
                return False
        wait_until(healthy, 30, "etcd healthy on the bridge")

    def etcd_prefix(self, prefix, timeout=5):
        """{key: value} of etcd's keys under prefix, asked over the bridge through etcd's JSON
        gateway (for failure messages: what the members wrote); {"<error>": why} if etcd does not answer."""
        raw = prefix.encode()
        end = raw[:-1] + bytes([raw[-1] + 1])  # the range of every key that starts with prefix
        body = json.dumps({"key": base64.b64encode(raw).decode(), "range_end": base64.b64encode(end).decode()})
        req = urllib.request.Request(f"{self.etcd_url}/v3/kv/range", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                kvs = json.load(r).get("kvs", [])
        except (OSError, ValueError) as e:
            return {"<error>": str(e)}
        return {base64.b64decode(kv["key"]).decode("utf-8", "replace"):
                base64.b64decode(kv.get("value", "")).decode("utf-8", "replace") for kv in kvs}

    # -------------------------------------------------------------- teardown
    def close(self):
        """Stops the in-process servers, then has the janitor remove everything; raises if it could not."""
        for m in self.members:
            if m.metadata:
                m.metadata.stop()
        if self.gcs:
            self.gcs.stop()
            self.gcs = None
        if self.janitor is None:
            return
        janitor, self.janitor = self.janitor, None
        janitor.stdin.close()  # EOF: clean up now
        ready, _, _ = select.select([janitor.stdout], [], [], 60)
        said = janitor.stdout.readline().decode().strip() if ready else "no answer within 60 s"
        janitor.stdout.close()
        for m in self.members:
            for p in m.spotvisors:
                p.kill()  # reaps the ones the janitor killed
                p.wait_exit(5)  # and lets its readers reach the end of its output
                p.proc.stdout.close()
                p.proc.stderr.close()
        for m in self.members:
            m.stop_sshd()  # the janitor killed it with everything else in the namespace: this reaps it
        if self.etcd_proc:
            if self.etcd_proc.poll() is None:
                self.etcd_proc.kill()
            self.etcd_proc.wait()
            self.etcd_log.close()
        if said != "clean":
            raise AssertionError(f"netns cleanup: {said} (state {self.state_path})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--janitor":
        janitor_main(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} --janitor STATE_FILE (started by NetnsGang, not by hand)")
