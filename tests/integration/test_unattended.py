"""The whole unattended loop (issue #30), simulated: a small group controller
in the test does what a managed instance group does, and drives real
spotvisor processes (`spotvisor daemon`, configured through each VM's
metadata as a template would) with a real trainer that checkpoints and
resumes.

The controller (GroupSim) plays the MIG against the fake Compute API
(tests/fakes/fake_compute.py, which never creates members by itself): while
the group's target size is above its member count it recreates a missing
member under the same name, once the old VM is gone; a member whose VM went
away without leaving the group (preempted, powered off) is repaired:
recreated under the same name. Every (re)creation is a new boot: a fresh
boot disk (state-dir, checkpoint-dir, workdir), a new metadata server with
the template's metadata (the spotvisor-* keys) and the member's created-by, a
new instance id and a new address. A preemption is what GCE does:
instance/preempted flips to TRUE, the ACPI power button follows (SIGTERM to
spotvisor, as systemd stops the service), and a VM still up when the Spot
window ends (preemption-window, 8 s here) is taken: spotvisor and its trainer
get SIGKILL. Checkpoints go to the fake Cloud Storage server
(tests/fakes/fake_gcs.py), whose `slow` fault makes a restore or a final sync
slow enough to be preempted in the middle.

The trainer is this file run as `test_unattended.py trainer`: a step every
20 ms; its checkpoint is one file, state.json (the step and the lineage: which
boot trained each step so far), replaced whole every 5 steps and at SIGINT;
every step trained is also logged, with its boot, outside the VMs (what really
happened), so that the test can prove that nothing committed was trained
again: each boot resumes from the newest commit there was, every commit seen is
a prefix of the final lineage, and the final lineage has every step once.

What the preempted run covers (the moments, shuffled with a seed printed with
the report; SPOTVISOR_UNATTENDED_SEED=N reproduces one): a preemption during
training (three, after a random number of steps); during the restore
(downloads slowed to 1.5 s: the preemption lands in restoring); during a
preemption's final sync, the VM taken at a random moment inside it (uploads
slowed, spotvisor SIGKILLed: the work since the last commit is lost, which is
allowed); a final sync whose uploads hang past the Spot window (spotvisor must
give up inside the window, by itself); and the completing boot's final sync
(uploads slowed, preempted in the middle: DONE still lands and the boot
leaves the group all the same, so no VM comes back for nothing). The gang: 3 members in one
group (gang-on-loss = wait), 5 preemptions of random members, during training
and during re-forming (a survivor waiting for the gang to form again). A
TERMINATE host maintenance is left to the group, as a preemption is. A run
whose trainer fails at every boot takes max-failed-boots (3) boots: two handed
back (instances.delete, recreated), the third writes FAILED and leaves. The
controller brings a member back 0.3 to 1 s after its VM is gone.

Each run prints: boots, preemptions, VM seconds (process lifetimes, as billed),
work lost (steps trained that the final lineage does not keep), and the time
from each preemption to the next trainer start.

SPOTVISOR_UNATTENDED_SOAK=N runs the single-VM loop N more times with other
seeds (skipped by default).
"""
import json
import os
import random
import signal
import sys
import time


def trainer_main(argv):
    """The trainer (run by spotvisor as `python3 test_unattended.py trainer ...`)."""
    import argparse
    import pathlib
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--step-s", type=float, default=0.02)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--fail-after", type=int, default=0, help="exit 3 after this many steps in this boot")
    ap.add_argument("--size", type=int, default=16384)
    args = ap.parse_args(argv)
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ckpt = os.environ["SPOTVISOR_CHECKPOINT_DIR"]
    boot = os.path.basename(os.path.dirname(os.path.abspath(ckpt)))  # the boot disk's name
    gen = os.environ.get("SPOTVISOR_GANG_GENERATION", "")
    log = open(args.log, "a", buffering=1)

    def say(ev, step):
        log.write(json.dumps({"t": time.time(), "boot": boot, "gen": gen, "pid": os.getpid(), "ev": ev,
                              "step": step}) + "\n")

    path = os.path.join(ckpt, "state.json")
    state = {"step": 0, "lineage": []}
    if os.environ.get("SPOTVISOR_RESUMED") == "1" and os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
    lineage = state["lineage"]
    if [s for s, _ in lineage] != list(range(1, state["step"] + 1)):
        say("inconsistent", state["step"])
        return 4
    say("resumed", state["step"])

    def save():
        body = json.dumps({"step": state["step"], "lineage": lineage, "pad": "x" * args.size})
        with open(path + ".tmp", "w") as f:
            f.write(body)
        os.replace(path + ".tmp", path)
        time.sleep(0.02)  # past the clock tick of the write, as docs/checkpoints.md says
        marker = os.environ.get("SPOTVISOR_CHECKPOINT_MARKER")
        if marker:
            pathlib.Path(marker).touch()
        say("saved", state["step"])

    os.makedirs(ckpt, exist_ok=True)
    trained = 0
    while state["step"] < args.steps and not stop:
        time.sleep(args.step_s)  # the step's work
        state["step"] += 1
        lineage.append([state["step"], boot])
        trained += 1
        say("trained", state["step"])
        if state["step"] % args.save_every == 0 or state["step"] == args.steps:
            save()
        if args.fail_after and trained >= args.fail_after:
            say("failing", state["step"])
            return 3
    if stop:
        save()
    say("exit", state["step"])
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["trainer"]:
    sys.exit(trainer_main(sys.argv[2:]))

import collections  # noqa: E402
import datetime  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import unittest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fakes"))
from harness import Spotvisor  # noqa: E402

PYTHON = "/usr/bin/python3"
PROJECT, NUMBER, ZONE, GROUP = "spotvisor-test-project", "123456789", "us-central1-a", "trainers"
MIG = f"projects/{NUMBER}/zones/{ZONE}/instanceGroupManagers/{GROUP}"
BUCKET, PREFIX = "unattended", "exp"
WINDOW_S = 8.0      # the Spot window (preemption-window): a preempted VM still up then is taken
STEP_S = 0.02


def event_time(e):
    """An event's time (its RFC 3339 "time" field), in seconds since the epoch."""
    return datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()


class BootVm:
    """One boot of one member: a fresh boot disk, its own metadata server, a spotvisor daemon."""

    def __init__(self, sim, name, number, instance_id):
        from fake_metadata import FakeMetadataServer
        self.sim, self.name, self.number, self.instance_id = sim, name, number, instance_id
        self.boot = f"boot{number:02d}"
        self.disk = os.path.join(sim.tmp, self.boot)
        os.makedirs(self.disk)
        attrs = dict(sim.template_metadata)
        attrs["created-by"] = MIG
        self.md = FakeMetadataServer(instance_name=name, attrs=attrs).start()
        self.md.set("instance/id", instance_id)
        self.md.set("instance/network-interfaces/0/ip", f"127.0.0.{10 + number}")  # a new VM, a new address
        self.conf = os.path.join(self.disk, "spotvisor.conf")
        with open(self.conf, "w") as f:  # what the image has on its disk: local paths only
            f.write(f"state-dir = {self.disk}/state\ncheckpoint-dir = {self.disk}/ckpt\nworkdir = {self.disk}\n")
        self.scenario = sim.next_scenario()
        self.committed_at_start = sim.committed_step()
        self.proc = None
        self.started = self.ended = self.exit_code = None
        self.preempted_at = self.maintenance_at = self.button_at = self.take_at = None
        self.taken = False
        self.moment = None        # where the interruption landed
        self.trigger = None       # what this boot's scenario waits for
        self.final_seen = None    # when the completing boot's final sync was seen
        self.slowed = False
        self.take_planned = False

    def launch(self):
        self.started = time.time()
        self.proc = Spotvisor(["daemon", "--config", self.conf],
                              env={"GCE_METADATA_HOST": f"127.0.0.1:{self.md.port}",
                                   "STORAGE_EMULATOR_HOST": f"127.0.0.1:{self.sim.gcs.port}"})

    def alive(self):
        return self.proc.proc.poll() is None

    def log(self, ev=None):
        return [e for e in self.sim.trainer_log() if e["boot"] == self.boot and ev in (None, e["ev"])]

    def trained(self):
        return [e["step"] for e in self.log("trained")]

    def state(self):
        """spotvisor's state, from its supervisor.state events."""
        states = self.proc.find("supervisor.state")
        return states[-1]["to"] if states else "starting"

    def since(self, state):
        """When spotvisor last entered `state` (None if it is not in it)."""
        states = self.proc.find("supervisor.state")
        return event_time(states[-1]) if states and states[-1]["to"] == state else None

    def preempt(self, moment):
        self.preempted_at = time.time()
        self.moment = moment
        self.take_at = self.preempted_at + WINDOW_S
        self.button_at = self.preempted_at + self.sim.rng.uniform(0.05, 0.5)
        self.md.set("instance/preempted", "TRUE")
        self.sim.preemptions.append(self)

    def maintenance(self):
        """A host maintenance that terminates the VM (on-host-maintenance TERMINATE, as Spot
        and GPU VMs have): the notice, then the VM is stopped when the window ends."""
        self.maintenance_at = time.time()
        self.moment = "a TERMINATE host maintenance"
        self.take_at = self.maintenance_at + WINDOW_S
        self.md.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")

    def take(self):
        """The VM is gone: spotvisor and its trainer, at once."""
        self.taken = True
        self.proc.kill()
        for pid in {e["pid"] for e in self.log()}:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def finish(self):
        self.ended = time.time()
        self.exit_code = self.proc.proc.returncode
        self.proc.wait_exit(5)
        for f in (self.proc.proc.stdout, self.proc.proc.stderr):
            f.close()
        self.md.stop()

    def end_reason(self):
        ends = self.proc.find("run.end")
        return ends[-1]["reason"] if ends else ("taken" if self.taken else "none")

    def actions(self):
        return [e.get("action") for e in self.proc.find("shutdown.start")]


class GroupSim:
    """The managed instance group's controller, the cloud's interruptions, and the observers."""

    def __init__(self, test, run_id, trainer_args, scenarios=(), seed=0, target=1, extra_metadata=None):
        from fake_compute import FakeComputeServer
        self.test, self.tmp, self.gcs = test, test.tmp, test.gcs
        self.run_id, self.rng, self.seed = run_id, random.Random(seed), seed
        self.scenarios = list(scenarios)
        self.total = int(trainer_args[trainer_args.index("--steps") + 1])
        self.log_path = os.path.join(self.tmp, f"{run_id}-trainer.log")
        self.compute = FakeComputeServer(PROJECT, ZONE, "trainers-0", project_number=NUMBER,
                                         token_ok=lambda t: t.startswith("fake-token-")).start()
        test.addCleanup(self.compute.stop)
        self.names = [f"trainers-{i}" for i in range(target)]
        self.compute.add_group(GROUP, zone=ZONE, target_size=target, members=self.names)
        command = [PYTHON, os.path.abspath(__file__), "trainer", "--log", self.log_path] + trainer_args
        self.template_metadata = {
            "spotvisor-command": json.dumps(command),
            "spotvisor-run-id": run_id,
            "spotvisor-bucket": f"gs://{BUCKET}/{PREFIX}",
            "spotvisor-sync-interval": "1s",
            "spotvisor-compute-endpoint": self.compute.endpoint,
            "spotvisor-on-exit": "poweroff",
            "spotvisor-shutdown-command": f"echo off >> {self.tmp}/poweroffs",
            "spotvisor-on-exit-timeout": "6s",
            "spotvisor-preemption-window": f"{int(WINDOW_S)}s",
            "spotvisor-stop-timeout": "5s",
            "spotvisor-kill-timeout": "2s",
            "spotvisor-metadata-watch-timeout": "5s",
            "spotvisor-max-failed-boots": "3",
        }
        self.template_metadata.update(extra_metadata or {})
        self.driver = self.drive_scenario
        self.boots, self.live, self.preemptions = [], [], []
        self.recreations = []   # {"due", "name", "why", "after": the boot it replaces, "done": DONE there then}
        self.pending = []       # recreations on their way
        self.commits = []       # {"t", "generation", "sequence", "step", "lineage"} as the watcher saw them
        self._stop_watch = threading.Event()
        self.started = False

    # ------------------------------------------------------------ the bucket
    def obj(self, name):
        return f"{PREFIX}/{self.run_id}/{name}"

    def exists(self, name):
        try:
            self.gcs.object_resource(BUCKET, self.obj(name))
            return True
        except Exception:
            return False

    def read_json(self, name):
        return json.loads(self.gcs.get_object_bytes(BUCKET, self.obj(name)))

    def committed(self):
        """(generation, sequence, state.json) of the newest commit, or None."""
        for _ in range(20):  # the manifest can be replaced between the reads
            if not self.exists("manifest.json"):
                return None
            try:
                gen = self.gcs.object_resource(BUCKET, self.obj("manifest.json"))["generation"]
                m = self.read_json("manifest.json")
                files = {f["path"]: f for f in m["files"]}
                state = json.loads(self.gcs.get_object_bytes(BUCKET, self.obj(files["state.json"]["object"])))
                if self.gcs.object_resource(BUCKET, self.obj("manifest.json"))["generation"] == gen:
                    return gen, m["sequence"], state
            except Exception:
                pass
            time.sleep(0.005)
        raise AssertionError("the newest commit could not be read")

    def committed_step(self):
        c = self.committed()
        return c[2]["step"] if c else 0

    def watch_commits(self):
        last = None
        while not self._stop_watch.is_set():
            c = self.committed()
            if c and c[0] != last:
                last = c[0]
                self.commits.append({"t": time.time(), "generation": c[0], "sequence": c[1], "step": c[2]["step"],
                                     "lineage": [tuple(x) for x in c[2]["lineage"]]})
            self._stop_watch.wait(0.02)

    def boot_records(self):
        return [json.loads(self.gcs.get_object_bytes(BUCKET, o["name"]))
                for o in self.gcs.objects(BUCKET, self.obj("boots/"))]

    def trainer_log(self):
        try:
            with open(self.log_path) as f:
                return [json.loads(l) for l in f if l.endswith("\n")]
        except FileNotFoundError:
            return []

    # ------------------------------------------------------------ the single-VM scenarios
    def next_scenario(self):
        return self.scenarios.pop(0) if self.scenarios else None

    def arm(self, vm):
        """This boot's interruption, set up before its spotvisor starts."""
        s = vm.scenario
        if s == "restore":
            # Slow downloads: the restore takes seconds, and the preemption lands inside it.
            self.gcs.fault("slow", delay_ms=1500, kind="download")
            vm.trigger = ("event", "restore.start", self.rng.uniform(0.05, 0.8))
        elif s in ("training", "vanish", "sync-hang", "maintenance"):
            vm.trigger = ("steps", self.rng.randint(4, 30), self.rng.uniform(0, STEP_S))
        elif s == "complete":
            vm.trigger = ("final-sync", None, self.rng.uniform(0.0, 0.15))

    def drive_scenario(self, now):
        for vm in self.live:
            if vm.alive() and vm.trigger and vm.preempted_at is None and vm.maintenance_at is None:
                self.fire(vm, now)

    def fire(self, vm, now):
        kind, what, delay = vm.trigger
        if kind == "event":
            e = vm.proc.find(what)
            if e and now >= event_time(e[0]) + delay:
                vm.preempt("the restore" if vm.state() in ("restoring", "starting") else f"after the restore ({vm.state()})")
        elif kind == "steps" and len(vm.trained()) >= what:
            time.sleep(delay)
            if vm.scenario == "maintenance":
                vm.maintenance()
                return
            if vm.scenario == "vanish":
                self.gcs.fault("slow", delay_ms=700, path_prefix="/upload/")
            elif vm.scenario == "sync-hang":
                self.gcs.fault("slow", delay_ms=60000, path_prefix="/upload/")
            vm.preempt({"training": "training", "vanish": "training; the VM taken in its final sync",
                        "sync-hang": "training; its final sync's uploads hang past the window"}[vm.scenario])
        elif kind == "final-sync":
            if not vm.slowed and any(s >= self.total - 3 for s in vm.trained()):
                vm.slowed = True  # the last steps: uploads slow from now on, so the final sync takes a while
                self.gcs.fault("slow", delay_ms=300, path_prefix="/upload/")
            if not vm.proc.find("trainer.exit"):
                return
            if vm.state() == "syncing":
                if vm.final_seen is None:
                    vm.final_seen = now
                elif now >= vm.final_seen + delay:
                    vm.preempt("the completing boot's final sync")
            elif vm.state() in ("finishing", "done", "unmounting", "powering-off"):
                vm.trigger = None  # the final sync was over before the preemption came
                vm.moment = f"not preempted: the final sync was over first ({vm.state()})"

    def cloud(self, vm, now):
        """What the cloud does to an interrupted VM: the power button, then the end of the window."""
        if vm.button_at and now >= vm.button_at:
            vm.button_at = None
            vm.proc.signal(signal.SIGTERM)  # the ACPI power button: systemd stops the service
        if vm.scenario == "vanish" and vm.preempted_at and not vm.take_planned and vm.state() == "syncing":
            vm.take_planned = True
            vm.take_at = now + self.rng.uniform(0.05, 1.0)  # a random moment of the final sync
        if vm.take_at and now >= vm.take_at:
            vm.moment += f" (taken while {vm.state()})"
            vm.take()

    # ------------------------------------------------------------ the group
    def start_boot(self, name):
        member = [m for m in self.compute.members(GROUP) if m["name"] == name][0]
        vm = BootVm(self, name, len(self.boots) + 1, member["id"])
        self.arm(vm)
        vm.launch()
        self.boots.append(vm)
        self.live.append(vm)
        return vm

    def run(self, timeout):
        """Until the group is at target size 0 with no member and no VM left."""
        watcher = threading.Thread(target=self.watch_commits, daemon=True)
        self._stop_watch.clear()
        watcher.start()
        deadline = time.time() + timeout
        try:
            if not self.started:
                self.started = True
                for name in self.names:
                    self.start_boot(name)
            while True:
                now = time.time()
                if now > deadline:
                    raise AssertionError(f"the group did not settle in {timeout}s: target "
                                         f"{self.compute.target_size(GROUP)}, members {self.compute.members(GROUP)}")
                self.driver(now)
                for vm in list(self.live):
                    if vm.alive():
                        self.cloud(vm, now)
                        continue
                    vm.finish()
                    self.live.remove(vm)
                    if not self.live:
                        self.gcs.fault("none")  # the faults set for a boot end with it
                    if vm.instance_id in {m["id"] for m in self.compute.members(GROUP)}:
                        # Gone without leaving the group: preempted, stopped by a maintenance (or
                        # powered off). The MIG repairs it: the same name, a new VM, in a while.
                        self.compute.remove_member(vm.name)
                        why = ("a preemption" if vm.preempted_at else "a host maintenance" if vm.maintenance_at
                               else "a power-off")
                        self.schedule(vm.name, "repair after " + why, vm, now)
                target = self.compute.target_size(GROUP)
                busy = {vm.name for vm in self.live} | {p["name"] for p in self.pending}
                for name in self.names:
                    if len(self.compute.members(GROUP)) + len(self.pending) >= target:
                        break
                    if name not in {m["name"] for m in self.compute.members(GROUP)} and name not in busy:
                        # Deleted outside the group (instances.delete): recreated under the same
                        # name once the old VM is gone.
                        self.schedule(name, "create: fewer members than the target size",
                                      [b for b in self.boots if b.name == name][-1], now)
                for p in [p for p in self.pending if now >= p["due"]]:
                    self.pending.remove(p)
                    if len(self.compute.members(GROUP)) < self.compute.target_size(GROUP):
                        self.compute.add_member(GROUP, p["name"])
                        p["done"] = self.exists("DONE")
                        self.recreations.append(p)
                        self.start_boot(p["name"])
                live_ids = {vm.instance_id for vm in self.live}
                for m in self.compute.members(GROUP):
                    if m["id"] not in live_ids:
                        raise AssertionError(f"member {m['name']} ({m['id']}) has no VM")
                if self.compute.target_size(GROUP) == 0 and not self.live and not self.pending \
                        and not self.compute.members(GROUP):
                    return
                time.sleep(0.02)
        finally:
            self._stop_watch.set()
            watcher.join(5)
            if sys.exc_info()[0] is not None:
                for vm in self.live:
                    vm.take()
                    vm.md.stop()

    def schedule(self, name, why, after, now):
        """The MIG brings the member back after a while (Spot capacity, a boot): 0.3 to 1 s here."""
        self.pending.append({"due": now + self.rng.uniform(0.3, 1.0), "name": name, "why": why, "after": after})

    # ------------------------------------------------------------ the report
    def report(self, title, work_lost):
        starts = sorted(event_time(e) for vm in self.boots for e in vm.proc.find("trainer.start"))
        gaps = []
        for vm in self.preemptions:
            nxt = [t for t in starts if t > vm.preempted_at]
            gaps.append(f"{nxt[0] - vm.preempted_at:.2f}" if nxt else "none (DONE)")
        vm_s = sum(vm.ended - vm.started for vm in self.boots if vm.ended)
        lines = [f"\n[{title}] run {self.run_id}, seed {self.seed}: boots {len(self.boots)}, preemptions "
                 f"{len(self.preemptions)}, VM seconds {vm_s:.1f}, work lost {sum(work_lost.values())} steps"]
        for vm in self.boots:
            lines.append(f"  {vm.boot} {vm.name}: {vm.end_reason():<12} exit {vm.exit_code!s:<3} "
                         f"{(vm.ended or time.time()) - vm.started:4.1f} s, committed step at boot "
                         f"{vm.committed_at_start:3}, trained {len(vm.trained()):3}, lost {work_lost.get(vm.boot, 0):2}"
                         + (f"; preempted during {vm.moment}" if vm.preempted_at else f"; {vm.moment}" if vm.moment else "") + ("; on-exit: " + ",".join(vm.actions()) if vm.actions() else ""))
        lines.append("  preemption -> next trainer start (s): " + ", ".join(gaps))
        why = collections.Counter(r["why"] + (" (DONE there)" if r["done"] else "") for r in self.recreations)
        lines.append("  the group recreated: " + (", ".join(f"{n} x {w}" for w, n in why.items()) or "nothing"))
        print("\n".join(lines), file=sys.stderr, flush=True)


class GangChaos:
    """Preemptions of random gang members: while the gang trains, and while it forms again."""

    def __init__(self, sim, plan):
        self.sim, self.plan, self.delay = sim, list(plan), None

    def __call__(self, now):
        sim = self.sim
        if not self.plan:
            return
        up = [vm for vm in sim.live if vm.alive() and vm.preempted_at is None]
        if self.plan[0] == "training":
            running = [vm.since("running") for vm in up]
            if len(up) < 3 or None in running:
                return
            if self.delay is None:
                self.delay = sim.rng.uniform(0.2, 0.8)
            if now >= max(running) + self.delay:
                self.hit(sim.rng.choice(up), "training")
        else:  # a survivor forming the gang again after the last preemption
            forming = [vm for vm in up if vm.state() == "forming" and vm.proc.find("gang.reforming")]
            running = [vm.since("running") for vm in up]
            if not forming and len(up) == 3 and None not in running and now > max(running) + 0.3:
                self.hit(sim.rng.choice(up), "training (the gang had formed again first)")
                return
            if not forming:
                return
            if self.delay is None:
                self.delay = sim.rng.uniform(0.05, 0.3)
            if now >= min(vm.since("forming") for vm in forming) + self.delay:
                vm = sim.rng.choice(forming)
                self.hit(vm, f"re-forming ({vm.state()})")

    def hit(self, vm, moment):
        self.plan.pop(0)
        self.delay = None
        rank = vm.proc.find("gang.formed")
        vm.preempt(moment + (f", rank {rank[-1]['rank']}" if rank else ""))


class UnattendedTest(unittest.TestCase):
    def setUp(self):
        from fake_gcs import FakeGcsServer
        self.tmp = tempfile.mkdtemp(prefix="spotvisor-unattended-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.gcs = FakeGcsServer(buckets=[BUCKET]).start()
        self.addCleanup(self.gcs.stop)

    def seed(self):
        env = os.environ.get("SPOTVISOR_UNATTENDED_SEED")
        return int(env) if env else random.SystemRandom().randrange(1 << 30)

    # ------------------------------------------------------------ the checks
    def lineage_checks(self, sim, total):
        """The final commit covers every step once, nothing committed was trained again.
        Returns the work lost: {boot: steps it trained that the final lineage does not keep}."""
        log = sim.trainer_log()
        self.assertFalse([e for e in log if e["ev"] == "inconsistent"], "a restore gave the trainer a torn checkpoint")
        _, _, final = sim.committed()
        lineage = [tuple(x) for x in final["lineage"]]
        self.assertEqual(final["step"], total)
        self.assertEqual([s for s, _ in lineage], list(range(1, total + 1)), "every step once, in order")
        trained_by = collections.defaultdict(list)
        for e in log:
            if e["ev"] == "trained":
                trained_by[e["step"]].append(e["boot"])
        for step, boot in lineage:
            self.assertIn(boot, trained_by[step], f"step {step} committed as {boot}'s, which never trained it")
        # Every commit seen is a prefix of the final lineage: nothing committed was dropped and
        # trained again; commits never go back.
        for c in sim.commits:
            self.assertEqual(c["lineage"], lineage[:len(c["lineage"])], f"commit #{c['sequence']} (step {c['step']}) was not kept")
        self.assertEqual([c["sequence"] for c in sim.commits], sorted(c["sequence"] for c in sim.commits))
        self.assertEqual([c["step"] for c in sim.commits], sorted(c["step"] for c in sim.commits))
        kept = set(lineage)
        work_lost = collections.Counter()
        for step, boots in trained_by.items():
            for b in boots:
                if (step, b) not in kept:
                    work_lost[b] += 1
        return work_lost

    def group_is_gone(self, sim, leaves):
        self.assertEqual(sim.compute.target_size(GROUP), 0)
        self.assertEqual(sim.compute.members(GROUP), [])
        self.assertFalse([vm for vm in sim.boots if vm.alive()])
        calls = [c for c, _ in sim.compute.calls()]
        self.assertEqual(calls.count("instanceGroupManagers.deleteInstances"), leaves, calls)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "poweroffs")), "never powered off in a group")

    # ------------------------------------------------------------ one VM, preempted again and again
    def preempted_run(self, seed):
        rng = random.Random(seed)
        middle = ["training", "restore", "vanish", "sync-hang", "training"]
        rng.shuffle(middle)
        # The first boot has nothing to restore; the last planned one completes the run.
        plan = ["training"] + middle + ["complete"]
        total = 200
        sim = GroupSim(self, "run1", ["--steps", str(total), "--step-s", str(STEP_S)], plan, seed)
        sim.run(timeout=150)
        return sim, total

    def check_preempted_run(self, sim, total):
        log = sim.trainer_log()
        self.assertTrue(sim.exists("DONE"), "no DONE marker")
        self.assertFalse(sim.exists("FAILED"))
        self.group_is_gone(sim, leaves=1)
        self.assertEqual(sim.compute.deleted_outside_group(), [], "no boot failed, so none was handed back")
        self.assertGreaterEqual(len(sim.preemptions), 5)
        for vm in sim.boots:
            self.assertFalse(vm.proc.find("run.failed_boot") or vm.proc.find("run.marked_failed"),
                             f"{vm.boot}: a preempted boot is not a failure")
            if vm.preempted_at is not None and vm.end_reason() == "completed" and not vm.taken:
                # Preempted in the final sync that wrote DONE: it leaves the group all the same, so the
                # group does not bring back a VM that would only find DONE.
                self.assertEqual(vm.actions(), ["leave"], f"{vm.boot}: a completed run leaves its group")
            elif vm.preempted_at is not None:
                self.assertEqual(vm.actions(), [], f"{vm.boot}: a preemption is left to the group")
        # Each boot resumed from the newest commit there was when it started, and that only went forward.
        for vm in sim.boots:
            resumed = [e["step"] for e in vm.log("resumed")]
            self.assertIn(resumed, ([], [vm.committed_at_start]), f"{vm.boot} did not resume from the newest commit")
            self.assertTrue(all(s > vm.committed_at_start for s in vm.trained()))
        starts = [vm.committed_at_start for vm in sim.boots]
        self.assertEqual(starts, sorted(starts), "the committed step went back between boots")
        work_lost = self.lineage_checks(sim, total)
        # The moments: what each planned one did.
        by = {vm.scenario: vm for vm in sim.boots if vm.scenario}
        self.assertEqual(by["restore"].end_reason(), "preempted")
        self.assertEqual(by["restore"].exit_code, 75, "preempted in the restore: no trainer")
        self.assertFalse(by["restore"].proc.find("trainer.start"))
        self.assertTrue(by["vanish"].taken, "the VM taken in its final sync")
        hang = by["sync-hang"]
        self.assertFalse(hang.taken, "spotvisor gave up on the final sync inside the Spot window, by itself")
        self.assertLess(hang.ended, hang.preempted_at + WINDOW_S)
        self.assertEqual(hang.end_reason(), "preempted")
        for vm in sim.boots:
            if vm.scenario in ("training", "restore", "complete"):
                self.assertEqual(work_lost[vm.boot], 0, f"{vm.boot}: a preemption whose final sync went through lost work")
        # The boot records: one per boot; only a VM taken (or whose last writes hung) left its end out.
        records = sim.boot_records()
        self.assertEqual(len(records), len(sim.boots))
        open_ended = [r for r in records if r.get("ended_at") is None]
        self.assertLessEqual(len(open_ended), len([vm for vm in sim.boots if vm.taken or vm is hang]))
        self.assertGreaterEqual(len(open_ended), len([vm for vm in sim.boots if vm.taken]))
        # After DONE, the group brings a VM back only if the completing boot, preempted in the final
        # sync that wrote DONE, was taken before it could leave: that boot ends at once, untrained.
        for r in sim.recreations:
            if r["done"]:
                self.assertIs(r["after"], by["complete"], r)
                self.assertNotEqual(by["complete"].actions(), ["leave"], "it left, yet the group brought a VM back")
        for vm in sim.boots:
            if vm.committed_at_start == total:
                self.assertEqual(vm.end_reason(), "already-done")
                self.assertFalse(vm.proc.find("trainer.start"), f"{vm.boot} trained after DONE")
        self.assertEqual(sim.boots[-1].actions(), ["leave"])
        self.assertIn(sim.boots[-1].end_reason(), ("completed", "already-done"))
        self.assertTrue([e for e in log if e["ev"] == "exit" and e["step"] == total])
        return work_lost

    def test_a_run_preempted_at_random_moments_finishes_by_itself(self):
        sim, total = self.preempted_run(self.seed())
        work_lost = {}
        try:
            work_lost = self.check_preempted_run(sim, total)
        finally:
            sim.report("preempted run", work_lost)

    @unittest.skipUnless(os.environ.get("SPOTVISOR_UNATTENDED_SOAK"), "SPOTVISOR_UNATTENDED_SOAK=N runs N more")
    def test_soak(self):
        base = self.seed()
        for i in range(int(os.environ["SPOTVISOR_UNATTENDED_SOAK"])):
            with self.subTest(seed=base + i):
                self.gcs.reset()
                self.tmp = tempfile.mkdtemp(prefix="spotvisor-unattended-")
                self.addCleanup(shutil.rmtree, self.tmp, True)
                sim, total = self.preempted_run(base + i)
                work_lost = {}
                try:
                    work_lost = self.check_preempted_run(sim, total)
                finally:
                    sim.report(f"soak {i}", work_lost)

    # ------------------------------------------------------------ a trainer that always fails
    def test_a_run_that_fails_at_every_boot_stops_after_max_failed_boots(self):
        sim = GroupSim(self, "bad1", ["--steps", "200", "--step-s", str(STEP_S), "--fail-after", "8"])
        try:
            sim.run(timeout=60)
        finally:
            sim.report("failing run", {})
        self.assertEqual(len(sim.boots), 3, "max-failed-boots 3: three boots, no more")
        self.assertEqual([vm.end_reason() for vm in sim.boots], ["failed"] * 3)
        self.assertEqual([vm.exit_code for vm in sim.boots], [3] * 3)
        self.assertEqual([vm.actions() for vm in sim.boots], [["retry"], ["retry"], ["leave"]])
        self.assertEqual([r["why"] for r in sim.recreations], ["create: fewer members than the target size"] * 2)
        self.assertEqual(len(sim.compute.deleted_outside_group()), 2, "two hand-backs (instances.delete)")
        self.group_is_gone(sim, leaves=1)
        records = sim.boot_records()
        self.assertEqual([r["reason"] for r in records], ["failed"] * 3)
        failed = sim.read_json("FAILED")
        self.assertEqual(len(failed["failed_boots"]), 3)
        self.assertEqual(failed["max_failed_boots"], 3)
        self.assertTrue(sim.boots[-1].proc.find("run.marked_failed"))
        self.assertFalse(sim.exists("DONE"))
        for vm in sim.boots:  # each try resumed from what the failed boot before it committed
            self.assertEqual([e["step"] for e in vm.log("resumed")], [vm.committed_at_start])

    # ------------------------------------------------------------ a host maintenance
    def test_a_terminating_host_maintenance_is_left_to_the_group_too(self):
        # A TERMINATE host maintenance (Spot and GPU VMs) stops the VM as a preemption does: the
        # boot ends `maintenance`, calls nothing, and the group brings the VM back.
        total = 80
        sim = GroupSim(self, "maint1", ["--steps", str(total), "--step-s", str(STEP_S)], ["maintenance"], self.seed())
        try:
            sim.run(timeout=60)
        finally:
            sim.report("a host maintenance", {})
        first, second = sim.boots
        self.assertEqual(first.end_reason(), "maintenance")
        self.assertEqual(first.actions(), [], "left to the group, like a preemption")
        self.assertFalse(first.taken, "spotvisor stopped the trainer and synced before the maintenance")
        self.assertEqual([r["why"] for r in sim.recreations], ["repair after a host maintenance"])
        self.assertFalse(first.proc.find("run.failed_boot"))
        self.assertEqual(second.end_reason(), "completed")
        self.assertGreater(second.committed_at_start, 0)
        self.assertEqual([e["step"] for e in second.log("resumed")], [second.committed_at_start])
        self.assertEqual(self.lineage_checks(sim, total), {}, "the maintenance's final sync lost nothing")
        self.assertTrue(sim.exists("DONE"))
        self.group_is_gone(sim, leaves=1)

    # ------------------------------------------------------------ a gang of 3 in one group
    def test_a_gang_of_three_in_a_group_preempted_at_random_finishes_by_itself(self):
        from test_gang import Etcd, free_port
        etcd = Etcd(self.tmp).start()
        self.addCleanup(etcd.stop)
        seed = self.seed()
        rng = random.Random(seed)
        plan = ["training", "forming", "training", "training", "training"]
        rest = plan[1:]
        rng.shuffle(rest)
        plan = plan[:1] + rest
        total = 200
        sim = GroupSim(self, "gang1", ["--steps", str(total), "--step-s", str(STEP_S)], seed=seed, target=3,
                       extra_metadata={"spotvisor-gang": "g1", "spotvisor-gang-size": "3", "spotvisor-gang-etcd": etcd.url,
                                       "spotvisor-gang-on-loss": "wait", "spotvisor-gang-reform-timeout": "60s",
                                       "spotvisor-gang-form-timeout": "60s", "spotvisor-gang-lease-ttl": "3s",
                                       "spotvisor-gang-master-port": str(free_port())})
        chaos = GangChaos(sim, plan)
        sim.driver = chaos
        work_lost = {}
        try:
            sim.run(timeout=150)
            self.assertEqual(chaos.plan, [], "the gang finished before every planned preemption")
            self.assertTrue(sim.exists("DONE"))
            self.group_is_gone(sim, leaves=3)
            self.assertEqual(sim.compute.deleted_outside_group(), [])
            self.assertEqual(len(sim.preemptions), 5)
            for vm in sim.boots:
                if vm.preempted_at is not None:
                    self.assertEqual(vm.actions(), [], f"{vm.boot}: a preemption is left to the group")
                else:
                    self.assertEqual((vm.end_reason(), vm.actions()), ("completed", ["leave"]), vm.boot)
            self.assertEqual(len(sim.boots), 3 + 5, "one new VM per preemption, none after DONE")
            # Every generation started from one step on every member: rank 0's newest commit.
            log = sim.trainer_log()
            gens = collections.defaultdict(list)
            for e in log:
                if e["ev"] == "resumed":
                    gens[int(e["gen"])].append(e)
            previous = 0
            for g in sorted(gens):
                steps = {e["step"] for e in gens[g]}
                self.assertEqual(len(steps), 1, f"generation {g}: members resumed from different steps {gens[g]}")
                step = steps.pop()
                first = min(e["t"] for e in gens[g])
                seen = [c["step"] for c in sim.commits if c["t"] < first]
                self.assertEqual(step, seen[-1] if seen else 0, f"generation {g} did not resume from the newest commit")
                self.assertGreaterEqual(step, previous)
                previous = step
            # The lineage is rank 0's: the other ranks' steps are the same steps (data parallel).
            rank0 = {vm.boot for vm in sim.boots if vm.name == "trainers-0"}
            lost = self.lineage_checks_gang(sim, total, rank0)
            work_lost = lost
        finally:
            sim.report("gang of 3", work_lost)

    def lineage_checks_gang(self, sim, total, rank0):
        """lineage_checks on rank 0's boots; every rank trains the same steps, so a step any rank
        trained beyond the commit its generation's successor resumed from is work lost."""
        log = sim.trainer_log()
        self.assertFalse([e for e in log if e["ev"] == "inconsistent"])
        _, _, final = sim.committed()
        lineage = [tuple(x) for x in final["lineage"]]
        self.assertEqual([s for s, _ in lineage], list(range(1, total + 1)))
        self.assertTrue({b for _, b in lineage} <= rank0, "the commits are rank 0's")
        for c in sim.commits:
            self.assertEqual(c["lineage"], lineage[:len(c["lineage"])], f"commit #{c['sequence']} was not kept")
        trained = collections.defaultdict(set)
        for e in log:
            if e["ev"] == "trained":
                trained[e["boot"]].add(e["step"])
        for step, boot in lineage:
            self.assertIn(step, trained[boot])
        # Work lost: per boot and generation, the steps trained past the next generation's start.
        starts = sorted({(int(e["gen"]), e["step"]) for e in log if e["ev"] == "resumed"})
        nxt = {g: (starts[i + 1][1] if i + 1 < len(starts) else total) for i, (g, _) in enumerate(starts)}
        lost = collections.Counter()
        for e in log:
            if e["ev"] == "trained" and e["step"] > nxt[int(e["gen"])]:
                lost[e["boot"]] += 1
        return lost


if __name__ == "__main__":
    unittest.main()
