#!/usr/bin/python3
"""An EC2 Spot interruption notice seen late, on a store that hangs (issue #31 point 4).

The notice is seen with L seconds left of its two minutes (a late poll, a restart, an IMDS
outage), while a 40 MiB checkpoint waits to be uploaded to a fake S3 whose part uploads and
multipart aborts hang for a minute. Every step after the notice must end before the notice's
time: the final sync (3 s before it), the abort of the unfinished multipart upload, the report of
what did not reach the bucket, run.end. For each L this prints how long before (or after) the
notice's time spotvisor exited, and whether the report was written; with --baseline, the same
for another binary, side by side.

  /usr/bin/python3 bench/late_notice.py --left 5 12 20 --baseline /path/to/old/spotvisor
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib as B  # noqa: E402
from fake_imds import FakeImdsServer  # noqa: E402
from fake_s3 import FakeS3Server  # noqa: E402

BUCKET = "late-notice"


def one(binary, fake_trainer, left):
    """Seconds from spotvisor's exit to the notice's time (negative: after it), and the report."""
    work = tempfile.mkdtemp(prefix="spotvisor-bench-late-")
    s3 = FakeS3Server(buckets=[BUCKET]).start()
    s3.add_credentials("ASIALATE", "late-secret", session_token="late-token")
    imds = FakeImdsServer(instance_id="i-0late", zone="eu-west-1b", region="eu-west-1",
                          tags={"spotvisor-bucket": f"s3://{BUCKET}/runs"}, role=None).start()
    imds.set_role("trainer", "ASIALATE", "late-secret", "late-token",
                  datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6))
    env = dict(os.environ, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, AWS_ENDPOINT_URL_S3=s3.endpoint,
               AWS_REGION="eu-west-1", AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="")
    env.pop("GCE_METADATA_HOST", None)
    ckpt = os.path.join(work, "ckpt")
    os.makedirs(ckpt)
    log = os.path.join(work, "spotvisor.log")
    try:
        with open(log, "wb") as out:
            p = subprocess.Popen([binary, "run", "--set", f"state-dir={work}/state", "--set", f"checkpoint-dir={ckpt}",
                                  "--set", "sync-interval=0", "--set", "sync-settle=0s", "--", fake_trainer],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

        def events():
            with open(log, errors="replace") as f:
                return [json.loads(x) for x in f if x.startswith("{")]

        if not B.wait_until(lambda: any(e.get("event") == "trainer.start" for e in events()) or p.poll() is not None):
            raise RuntimeError(f"spotvisor did not start (log {log})")
        with open(os.path.join(ckpt, "model.pt"), "wb") as f:
            f.write(os.urandom(40 << 20))
        s3.fault("upload_part", delay=60, count=None)
        s3.fault("abort", delay=60, count=None)
        # The notice's time in whole seconds, as EC2 (and the fake) write it.
        when = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=left)).replace(microsecond=0)
        imds.set_instance_action("terminate", when)
        try:
            p.wait(timeout=left + 90)
        except subprocess.TimeoutExpired:
            B.kill_quietly(p.pid)
            p.wait()
        ended = datetime.datetime.now(datetime.timezone.utc)
        evs = events()
        report = [e for e in evs if e.get("event") in ("sync.timeout", "sync.failed") and "model.pt" in e.get("message", "")]
        run_end = [e for e in evs if e.get("event") == "run.end"]
        return (when - ended).total_seconds(), bool(report), bool(run_end)
    finally:
        s3.stop()
        imds.stop()
        shutil.rmtree(work, True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B.add_binary_flags(ap)
    ap.add_argument("--left", type=float, nargs="+", default=[5, 12, 20],
                    help="seconds left of the notice when it is seen (default 5 12 20)")
    ap.add_argument("--baseline", help="another spotvisor binary, run the same way")
    args = ap.parse_args()
    B.check_binaries(args)
    print(f"machine: {B.machine()}; spotvisor {B.build_type(args.spotvisor)}", flush=True)
    head = f"{'left s':>7} {'exit before the notice s':>25} {'report':>7} {'run.end':>8}"
    if args.baseline:
        head += f"   {'baseline: exit before s':>24} {'report':>7} {'run.end':>8}"
    rows = []
    for left in args.left:
        row = [left, *one(args.spotvisor, args.fake_trainer, left)]
        if args.baseline:
            row += list(one(args.baseline, args.fake_trainer, left))
        rows.append(row)
        print(f"  seen with {left:g} s left: done", file=sys.stderr, flush=True)
    print(head)
    for row in rows:
        line = f"{row[0]:>7g} {row[1]:>25.2f} {'yes' if row[2] else 'NO':>7} {'yes' if row[3] else 'NO':>8}"
        if args.baseline:
            line += f"   {row[4]:>24.2f} {'yes' if row[5] else 'NO':>7} {'yes' if row[6] else 'NO':>8}"
        print(line)
    kept = all(r[1] > 0 and r[2] and r[3] for r in rows)
    print("every step ended before the notice's time, with the report" if kept else "NOT KEPT")
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
