#!/usr/bin/env python3
"""How safe is my work? Read what spotvisor says the bucket holds.

spotvisor rewrites $SPOTVISOR_COMMITTED_FILE (STATE_DIR/committed.json) after
every commit and restore: the commit's sequence, when it was committed, and
which of the trainer's files (paths relative to $SPOTVISOR_CHECKPOINT_DIR,
with sizes) it holds. A trainer can use it to:

- delete an old local checkpoint only once a newer one is in the bucket
  (Hugging Face's save_total_limit deletes checkpoint-N/ as soon as a newer
  one is written, before any sync has seen it);
- log how much work a preemption would cost right now;
- wait, before exiting, until its last save is committed.

Import it (`from committed import committed, holds`) or run it:

    python3 committed.py                       # a summary
    python3 committed.py --holds PATH [--size N]   # exit 0 if the commit holds PATH
    python3 committed.py --wait PATH --timeout 60  # wait until it does

Standard library only. The file is replaced atomically (never half-written),
so reading it at any moment is safe; it is absent until spotvisor has
restored (and without a bucket).
"""
import argparse
import datetime
import json
import os
import sys
import time


def committed(path=None):
    """The parsed committed.json, or None if there is none (yet)."""
    path = path or os.environ.get("SPOTVISOR_COMMITTED_FILE")
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def holds(info, rel_path, size=None):
    """Whether that commit holds rel_path (with this size, if given)."""
    if not info:
        return False
    for entry in info.get("files", []):
        if entry.get("path") == rel_path and (size is None or entry.get("size") == size):
            return True
    return False


def age_seconds(info, now=None):
    """Seconds since the newest commit, or None before the first one."""
    if not info or not info.get("committed_at"):
        return None
    text = info["committed_at"]
    # Python 3.11's fromisoformat takes at most microseconds and no "Z" before 3.11.
    base, _, rest = text.partition(".")
    frac = rest.rstrip("Zz")[:6]
    when = datetime.datetime.fromisoformat(base + (("." + frac) if frac else "") + "+00:00")
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return max(0.0, (now - when).total_seconds())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", help="committed.json (default: $SPOTVISOR_COMMITTED_FILE)")
    ap.add_argument("--holds", metavar="PATH", help="exit 0 if the commit holds PATH, 1 if not")
    ap.add_argument("--wait", metavar="PATH", help="wait until the commit holds PATH")
    ap.add_argument("--size", type=int, help="with --holds/--wait: and has this size")
    ap.add_argument("--timeout", type=float, default=60.0, help="with --wait: give up after this many seconds (exit 1)")
    args = ap.parse_args()
    if args.wait:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            if holds(committed(args.file), args.wait, args.size):
                return 0
            time.sleep(0.2)
        print(f"{args.wait} is not committed after {args.timeout:g}s", file=sys.stderr)
        return 1
    info = committed(args.file)
    if args.holds:
        return 0 if holds(info, args.holds, args.size) else 1
    if info is None:
        print("no committed.json: spotvisor has not restored yet, or no bucket is configured")
        return 1
    if info.get("sequence", 0) == 0:
        print(f"nothing committed yet to {info.get('bucket')}")
        return 0
    age = age_seconds(info)
    print(f"commit #{info['sequence']} in {info.get('bucket')}: {info.get('file_count')} file(s), "
          f"{info.get('bytes')} bytes, committed {age:.0f}s ago by {info.get('instance')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
