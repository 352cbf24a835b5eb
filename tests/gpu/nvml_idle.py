"""Idle detection through the real NVML (issue #29's GPU check): a trainer
that only sleeps while ANOTHER process keeps the GPU busy is not idle; once
the GPU is idle too, `idle.detected` comes within `idle-timeout` and a margin.

Runs `spotvisor run` with idle-timeout = --timeout against the fake metadata
server; the trainer is `sleep`; the busy process is a PyTorch matrix-product
loop started beside it (not in the trainer's process tree, so only NVML can
see it). Prints one line per phase and exits 1 if a phase went wrong.

  /opt/torch/.venv/bin/python3 tests/gpu/nvml_idle.py --spotvisor .gpu-bundle/bin/spotvisor
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))
from fake_metadata import FakeMetadataServer  # noqa: E402

BUSY = r'''
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
'''


def events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spotvisor", required=True)
    ap.add_argument("--timeout", type=int, default=20, help="idle-timeout, seconds")
    ap.add_argument("--busy", type=int, default=45, help="seconds the other process keeps the GPU busy")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="nvml-idle-")
    srv = FakeMetadataServer().start()
    log = os.path.join(work, "spotvisor.log")
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(args.busy)])
    time.sleep(3)  # the GPU is busy before the trainer starts
    t0 = time.monotonic()
    with open(log, "wb") as out:
        p = subprocess.Popen([args.spotvisor, "run", "--set", f"idle-timeout={args.timeout}s", "--set", "log-format=json",
                              "--set", f"state-dir={work}/state", "--set", "on-exit=none", "--", "sleep", "600"],
                             stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, GCE_METADATA_HOST=f"127.0.0.1:{srv.port}"))
        busy.wait()
        busy_end = time.monotonic()
        ok = True
        early = [e for e in events(log) if e.get("event") == "idle.detected"]
        if early:
            print(f"FAIL: idle.detected while another process kept the GPU busy ({busy_end - t0:.0f} s)")
            ok = False
        else:
            print(f"ok: no idle.detected in {busy_end - t0:.0f} s of a busy GPU (idle-timeout {args.timeout} s)")
        try:
            p.wait(timeout=args.timeout * 2 + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            print(f"FAIL: no idle.detected within {args.timeout * 2 + 30} s of the GPU going idle")
            return 1
        took = time.monotonic() - busy_end
        nvml = [e for e in events(log) if "nvml" in (e.get("message", "") + e.get("event", "")).lower()]
        for e in nvml[:3]:
            print(f"  {e.get('event')}: {e.get('message')}")
        if not any(e.get("event") == "idle.detected" for e in events(log)):
            print("FAIL: spotvisor ended without idle.detected")
            return 1
        print(f"{'ok' if ok else 'FAIL'}: idle.detected {took:.1f} s after the GPU went idle (idle-timeout {args.timeout} s)")
    srv.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
