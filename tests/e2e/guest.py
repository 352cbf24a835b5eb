"""Boots the baked spotvisor image under QEMU against the host-side fakes.

Everything the guest can reach is a fake on this host's loopback, through
QEMU's user-mode network with restrict=on: the guest reaches nothing else (not
the host's other ports, not the outside world; a default endpoint that a test
forgot to override fails instead of leaving the machine), only these forwards,
each connection a socat of its own (guestfwd's cmd: form). A GCE scenario
(Fakes):

  169.254.169.254:80        fake_metadata.py
  FAKES_ADDR:GCS_PORT       fake_gcs.py       (127.0.0.1:GCS_PORT on the host)
  FAKES_ADDR:LOGGING_PORT   fake_logging.py   (127.0.0.1:LOGGING_PORT on the host)
  FAKES_ADDR:COMPUTE_PORT   fake_compute.py   (only for the MIG scenario: Fakes(mig=...))

An EC2 scenario (Ec2Fakes), at fixed guest ports because the endpoints are
baked into the image (a drop-in for spotvisor.service, AWS_ENDPOINTS below,
written by install-spotvisor.sh):

  169.254.169.254:80        fake_imds.py      (also metadata.google.internal: spotvisor's GCE probe meets it)
  AWS_FAKES_ADDR:9000       fake_s3.py        (AWS_ENDPOINT_URL_S3)
  AWS_FAKES_ADDR:9001       fake_cloudwatch_logs.py (AWS_ENDPOINT_URL_CLOUDWATCH_LOGS)
  AWS_FAKES_ADDR:9002       fake_ec2.py       (AWS_ENDPOINT_URL_EC2: the spotvisor-phase tag)

FAKES_ADDR and AWS_FAKES_ADDR are other addresses on the guest's link rather
than the user network's gateway: QEMU refuses guestfwd rules on the gateway
address, and without restrict=on the gateway would also lead to the real
network.

Every wait is a condition with a bound; QEMU is killed by pid when one runs out.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))

from fake_cloudwatch_logs import FakeCloudWatchLogsServer  # noqa: E402
from fake_compute import FakeComputeServer  # noqa: E402
from fake_ec2 import FakeEc2Server  # noqa: E402
from fake_gcs import FakeGcsServer  # noqa: E402
from fake_imds import FakeImdsServer  # noqa: E402
from fake_logging import FakeLoggingServer  # noqa: E402
from fake_metadata import FakeMetadataServer, TOKEN_PATH  # noqa: E402
from fake_s3 import FakeS3Server  # noqa: E402

PROJECT = "spotvisor-test-project"   # fake_metadata's project id
NET = "169.254.0.0/16"
FAKES_ADDR = "169.254.0.10"          # where the guest finds fake GCS and fake Cloud Logging
TOKEN = "e2e-token"
BUCKET = "e2e-bucket"
DATASET_DISK = "e2e-dataset"
METADATA_ADDR = "169.254.169.254"    # GCE's metadata server and EC2's IMDS, at their real address

# EC2. The image is baked once per run for every scenario, so the AWS endpoints are fixed
# guest-side addresses, set in a drop-in for spotvisor.service (install-spotvisor.sh --unit-env);
# each EC2 scenario forwards them to its fakes' dynamic host ports. The GCE scenarios have the
# same drop-in and never use it (gs:// buckets, no EC2 API): nothing listens there for them.
AWS_FAKES_ADDR = "169.254.0.11"
S3_GUEST_PORT = 9000
CLOUDWATCH_LOGS_GUEST_PORT = 9001   # fake CloudWatch Logs (log-to = auto on EC2)
EC2_GUEST_PORT = 9002
AWS_ENDPOINTS = {
    "AWS_ENDPOINT_URL_S3": f"http://{AWS_FAKES_ADDR}:{S3_GUEST_PORT}",
    "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": f"http://{AWS_FAKES_ADDR}:{CLOUDWATCH_LOGS_GUEST_PORT}",
    "AWS_ENDPOINT_URL_EC2": f"http://{AWS_FAKES_ADDR}:{EC2_GUEST_PORT}",
}
EC2_REGION = "eu-west-1"             # not us-east-1, S3's default when AWS_REGION is unset
EC2_INSTANCE_ID = "i-0e2e5ec2000000001"
ROLE = "spotvisor-e2e-role"          # the instance profile's role, its keys served by fake_imds
ROLE_KEY_ID = "ASIAE2EROLEKEY000001"
ROLE_SECRET = "e2eRoleSecret/doNotPrint/7bKq2Vd9xZp4Wm1"
ROLE_TOKEN = "E2eRoleSessionToken//doNotPrint//wEaCXVzLWVhc3QtMSJHMEUCIQ"


def log(msg):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_until(predicate, timeout, what, interval=0.05):
    """Polls predicate until it returns something truthy; AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)  # the polling interval of a bounded wait


class Fakes:
    """The three host-side fakes a guest talks to, on loopback."""

    def __init__(self, instance_name, attrs, mig=None):
        self.metadata = FakeMetadataServer(instance_name=instance_name, attrs={}).start()
        self.gcs = FakeGcsServer(buckets=[BUCKET], require_token=TOKEN).start()
        self.logging = FakeLoggingServer(PROJECT).start()
        # mig: the name of a zonal managed instance group this VM is a member of
        # (the Compute API, requiring the metadata server's token, and created-by).
        self.compute = None
        if mig:
            zone = self.metadata.state("instance/zone")["value"].rsplit("/", 1)[1]
            number = self.metadata.state("project/numeric-project-id")["value"]
            self.compute = FakeComputeServer(PROJECT, zone, instance_name, token_ok=lambda t: t == TOKEN,
                                             project_number=number).start()
            self.compute.add_group(mig, zone=zone, members=[instance_name])
            attrs = dict(attrs)
            attrs["created-by"] = f"projects/{number}/zones/{zone}/instanceGroupManagers/{mig}"
            attrs["spotvisor-compute-endpoint"] = f"http://{FAKES_ADDR}:{self.compute.port}/compute/v1"
        # A fixed token, so fake_gcs can require it (the generated ones count up).
        self.metadata.set(TOKEN_PATH, json.dumps(
            {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}))
        base = {
            "spotvisor-storage-endpoint": f"http://{FAKES_ADDR}:{self.gcs.port}",
            "spotvisor-logging-endpoint": f"http://{FAKES_ADDR}:{self.logging.port}",
        }
        base.update(attrs)
        for k, v in base.items():
            self.metadata.set(f"instance/attributes/{k}", v)

    def forwards(self):
        """(guest address, guest port, host port) for QEMU's guestfwd rules."""
        out = [(METADATA_ADDR, 80, self.metadata.port),
               (FAKES_ADDR, self.gcs.port, self.gcs.port),
               (FAKES_ADDR, self.logging.port, self.logging.port)]
        if self.compute:
            out.append((FAKES_ADDR, self.compute.port, self.compute.port))
        return out

    def stop(self):
        for f in (self.metadata, self.gcs, self.logging, self.compute):
            if f is None:
                continue
            try:
                f.stop()
            except Exception as e:  # noqa: BLE001 - cleanup must go on
                log(f"stopping a fake: {e}")

    # ---- what the fakes recorded
    def events(self, name=None):
        """spotvisor's events as received by the fake Cloud Logging API."""
        out = []
        for e in self.logging.entries("spotvisor"):
            p = e.get("jsonPayload", {})
            if name is None or p.get("event") == name:
                out.append(p)
        return out

    def trainer_lines(self):
        return [e.get("jsonPayload", {}).get("message", "") for e in self.logging.entries("spotvisor-trainer")]

    def guest_attributes(self, namespace="spotvisor"):
        """What the guest PUT under instance/guest-attributes/NAMESPACE/, as key -> value."""
        out = {}
        for e in self.metadata.log():
            path = e.get("path", "")
            if e.get("method") == "PUT" and path.startswith(f"instance/guest-attributes/{namespace}/"):
                key = path.rsplit("/", 1)[1]
                try:
                    out[key] = self.metadata.state(path)["value"]
                except Exception:  # noqa: BLE001 - deleted since: skip it
                    pass
        return out

    def objects(self, prefix=""):
        return {o["name"]: o for o in self.gcs.objects(BUCKET, prefix)}

    def object_bytes(self, name):
        return self.gcs.get_object_bytes(BUCKET, name)


class Ec2Fakes:
    """The host-side fakes an EC2 Spot instance talks to: IMDSv2 (tags, user data, the
    instance role's keys, the spot notice), S3 and the EC2 API, all in EC2_REGION. S3 and
    the EC2 API accept only the role's session keys (with their token), so every request
    they answered was signed with the keys spotvisor got from IMDS."""

    def __init__(self, tags, user_data=None):
        self.imds = self.s3 = self.ec2 = self.cloudwatch_logs = None
        try:
            self.imds = FakeImdsServer(instance_id=EC2_INSTANCE_ID, region=EC2_REGION, tags=tags,
                                       user_data=user_data).start()
            self.imds.set_role(ROLE, ROLE_KEY_ID, ROLE_SECRET, ROLE_TOKEN, time.time() + 6 * 3600)
            self.s3 = FakeS3Server(region=EC2_REGION, buckets=[BUCKET]).start()
            self.s3.add_credentials(ROLE_KEY_ID, ROLE_SECRET, session_token=ROLE_TOKEN)
            self.ec2 = FakeEc2Server(region=EC2_REGION, instances=[EC2_INSTANCE_ID]).start()
            self.ec2.add_credentials(ROLE_KEY_ID, ROLE_SECRET, session_token=ROLE_TOKEN)
            # CloudWatch Logs: log-to = auto writes there on EC2 (IMDS at its default address).
            self.cloudwatch_logs = FakeCloudWatchLogsServer(region=EC2_REGION).start()
            self.cloudwatch_logs.add_credentials(ROLE_KEY_ID, ROLE_SECRET, session_token=ROLE_TOKEN)
        except BaseException:
            self.stop()
            raise

    def forwards(self):
        """(guest address, guest port, host port) for QEMU's guestfwd rules."""
        return [(METADATA_ADDR, 80, self.imds.port),
                (AWS_FAKES_ADDR, S3_GUEST_PORT, self.s3.port),
                (AWS_FAKES_ADDR, EC2_GUEST_PORT, self.ec2.port),
                (AWS_FAKES_ADDR, CLOUDWATCH_LOGS_GUEST_PORT, self.cloudwatch_logs.port)]

    def stop(self):
        for f in (self.imds, self.s3, self.ec2, self.cloudwatch_logs):
            if f is None:
                continue
            try:
                f.stop()
            except Exception as e:  # noqa: BLE001 - cleanup must go on
                log(f"stopping a fake: {e}")

    # ---- what the fakes recorded (the same names as Fakes where they mean the same)
    def objects(self, prefix=""):
        return self.s3.objects(BUCKET, prefix)

    def object_bytes(self, name):
        return self.s3.get_object_bytes(BUCKET, name)

    def cloudwatch_events(self, name=None):
        """spotvisor's events in CloudWatch Logs (group spotvisor, stream INSTANCE/spotvisor)."""
        try:
            raw = self.cloudwatch_logs.events("spotvisor", f"{EC2_INSTANCE_ID}/spotvisor")
        except Exception:  # noqa: BLE001 - no group or stream yet
            return []
        out = []
        for e in raw:
            try:
                j = json.loads(e["message"])
            except ValueError:
                continue
            if name is None or j.get("event") == name:
                out.append(j)
        return out


class Qmp:
    """A minimal QMP client: capabilities negotiation, then one command at a time."""

    def __init__(self, path, timeout=10):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self._read()  # greeting
        self.execute("qmp_capabilities")

    def _read(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("QMP socket closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, command, **arguments):
        msg = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self._read()
            if "return" in reply:
                return reply["return"]
            if "error" in reply:
                raise RuntimeError(f"QMP {command}: {reply['error']}")
            # asynchronous events ({"event": ...}) are skipped

    def close(self):
        self.sock.close()


# QEMU run states in which the guest will never power off by itself.
STUCK = {"internal-error", "guest-panicked", "io-error"}

# A JSON line of spotvisor's as journald forwards it. Where it ends is left to the JSON
# decoder: the kernel's own console lines can land right after it, without a newline.
_SPOTVISOR_LINE = re.compile(r"spotvisor\[\d+\]: (?=\{)")
_JSON = json.JSONDecoder()


class Vm:
    """One QEMU guest booted from the baked image (copy-on-write: snapshot=on)."""

    def __init__(self, base_dir, image, dataset, fakes, workdir, name):
        self.fakes = fakes
        self.serial_path = os.path.join(workdir, f"{name}.serial.log")
        self.qmp_path = os.path.join(workdir, f"{name}.qmp")
        self.stderr_path = os.path.join(workdir, f"{name}.qemu.log")
        self._serial_text = ""
        self._serial_pos = 0
        fwd = [f"guestfwd=tcp:{addr}:{guest_port}-cmd:socat - TCP:127.0.0.1:{host_port}"
               for addr, guest_port, host_port in fakes.forwards()]
        netdev = ",".join([f"user,id=n0,net={NET},restrict=on"] + fwd)
        self.argv = [
            "qemu-system-x86_64", "-accel", "tcg,tb-size=128", "-cpu", "max", "-smp", "2", "-m", "1024",
            "-kernel", os.path.join(base_dir, "vmlinuz"), "-initrd", os.path.join(base_dir, "initrd.img"),
            # panic=-1 with -no-reboot: a guest kernel panic ends QEMU at once.
            # show_status=error: the console carries the journal (see build-image.sh), so
            # systemd's status lines would only repeat it. The kernel's messages stay: they
            # are what shows where a guest that never reaches userspace got stuck.
            "-append", "root=/dev/vda rw console=ttyS0 panic=-1 systemd.show_status=error",
            "-drive", f"file={image},if=virtio,format=raw,snapshot=on",
            "-drive", f"file={dataset},if=none,id=ds,format=raw,snapshot=on",
            "-device", "virtio-scsi-pci,id=scsi0",
            "-device", f"scsi-hd,bus=scsi0.0,drive=ds,vendor=Google,product=PersistentDisk,"
                       f"serial={DATASET_DISK},device_id={DATASET_DISK}",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,romfile=",
            "-display", "none", "-monitor", "none", "-serial", f"file:{self.serial_path}",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off", "-no-reboot",
        ]
        self.proc = None
        self.started = None
        self.exited = None

    def start(self):
        # A reused work dir: never read a previous boot's console or socket.
        for path in (self.serial_path, self.qmp_path, self.stderr_path):
            if os.path.lexists(path):
                os.unlink(path)
        log("qemu " + " ".join(a if " " not in a else repr(a) for a in self.argv))
        self.started = time.monotonic()
        with open(self.stderr_path, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        return self

    # ---- QEMU's life
    def running(self):
        if self.proc.poll() is None:
            return True
        if self.exited is None:
            self.exited = time.monotonic()
        return False

    def wait_exit(self, timeout, what="QEMU to exit (the guest to power off)"):
        """Waits for QEMU to exit. Under emulation an internal error pauses QEMU instead of
        ending it, so its status is asked for now and then: a stuck VM fails at once."""
        last_query = [time.monotonic()]

        def exited():
            if not self.running():
                return True
            if time.monotonic() - last_query[0] >= 2:
                last_query[0] = time.monotonic()
                state = self.status_or_none()
                if state and state.get("status") in STUCK:
                    raise AssertionError(f"QEMU is stuck in state {state['status']!r} while waiting for {what}")
            return False
        wait_until(exited, timeout, what, interval=0.1)
        return self.proc.returncode

    def diagnose(self):
        """QEMU's view of a guest that did not do what was expected: its run state and
        where the CPUs are (for a guest that hangs before it prints anything)."""
        if self.proc is None or self.proc.poll() is not None:
            return f"QEMU exited with {self.proc.returncode if self.proc else None}"
        try:
            q = self.qmp()
            try:
                status = q.execute("query-status")
                cpus = q.execute("human-monitor-command", **{"command-line": "info cpus"})
                regs = q.execute("human-monitor-command", **{"command-line": "info registers"})
            finally:
                q.close()
        except (OSError, ConnectionError, ValueError, RuntimeError, AssertionError) as e:
            return f"QMP unavailable: {e}"
        rip = " ".join(l.strip() for l in regs.splitlines() if l.startswith(("RIP", "CR0")))
        return f"QEMU running, status {status}; {cpus.strip()}; CPU0 {rip}"

    def status_or_none(self):
        """query-status, or None if QEMU is going away (the socket refuses or closes)."""
        try:
            return self.status()
        except (OSError, ConnectionError, ValueError, AssertionError):
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self.exited is None and self.proc:
            self.exited = time.monotonic()

    def qmp(self):
        wait_until(lambda: os.path.exists(self.qmp_path), 10, "the QMP socket")
        return Qmp(self.qmp_path)

    def status(self):
        q = self.qmp()
        try:
            return q.execute("query-status")
        finally:
            q.close()

    def power_button(self):
        q = self.qmp()
        try:
            q.execute("system_powerdown")
        finally:
            q.close()

    # ---- the serial console
    def serial(self):
        try:
            with open(self.serial_path, "rb") as f:
                f.seek(self._serial_pos)
                data = f.read()
        except FileNotFoundError:
            return self._serial_text
        self._serial_pos += len(data)
        self._serial_text += data.decode("utf-8", "replace")
        return self._serial_text

    def wait_serial(self, pattern, timeout, what=None):
        rx = re.compile(pattern, re.M)

        def found():
            m = rx.search(self.serial())
            if m:
                return m
            if not self.running():
                raise AssertionError(f"QEMU exited ({self.proc.returncode}) before the serial log showed "
                                     f"{what or pattern}")
            return None
        return wait_until(found, timeout, what or f"/{pattern}/ on the serial console")

    def serial_events(self, name=None):
        """spotvisor's JSON lines as forwarded by journald to the console."""
        out = []
        for line in self.serial().splitlines():
            m = _SPOTVISOR_LINE.search(line)
            if not m:
                continue
            try:
                e, _ = _JSON.raw_decode(line, m.end())
            except ValueError:
                continue  # a line cut by a concurrent console write
            if name is None or e.get("event") == name:
                out.append(e)
        return out

    def serial_tail(self, lines=60):
        """The last lines, without the colour codes and blank lines of systemd's status output."""
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", self.serial())
        kept = [l.rstrip() for l in text.splitlines() if l.strip()]
        return "\n".join(kept[-lines:])


def _die_with_parent():
    """In QEMU's child before exec: SIGKILL it if the test process dies (a ctest
    timeout, ^C), so no emulated guest is left running with nobody to stop it."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def make_dataset_disk(path):
    """A small ext4 disk standing in for the dataset PD."""
    src = tempfile.mkdtemp(prefix="spotvisor-e2e-dataset-")
    try:
        with open(os.path.join(src, "DATASET-MARKER"), "w") as f:
            f.write("the e2e dataset disk\n")
        subprocess.run(["mke2fs", "-q", "-t", "ext4", "-L", "dataset", "-d", src, path, "32M"],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        shutil.rmtree(src, True)
