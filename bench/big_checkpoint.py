#!/usr/bin/python3
"""Big checkpoints (issue #15): spotvisor against rclone, tuned, on one fake
Cloud Storage, next to what the fake alone can absorb.

One fake GCS JSON API server (tests/fakes/fake_gcs.py) runs in this process
on 127.0.0.1; both tools move the same local files. Measurements:

  (0) the fake alone: N curl processes at once upload (then download) a
      file of the big size / N each, with no client hashing at all: the
      ceiling this machine and this fake allow.
  (1) one 4 GiB file, first upload
      spotvisor: `spotvisor run -- true` on a new run-id: its final sync
                 (parallel composite upload above sync-parallel-min-size)
      rclone:    `rclone copy DIR fakegcs:...` with the best --transfers
  (2) that file restored into an empty dir
      spotvisor: `spotvisor run -- true` on an empty checkpoint-dir: its
                 restore (parallel ranged reads)
      rclone:    `rclone copy fakegcs:... DIR` with the best
                 --multi-thread-streams (rclone's parallel ranged download)
  (3) 1 GiB as one file plus 1,000 x 64 KiB, first upload, as (1)
  (4) a no-op sync of 10,000 files: bench/sync_vs_rclone.py --only noop
      measures it (same daemon-and-SIGUSR1 method); run it beside this.

rclone's settings are tuned first (--tune, on by default): each candidate
runs once on the same data at --tune-scale, the fastest is used for the
measured runs, and all candidates' times are printed.

spotvisor's CPU per GiB is its process's utime + stime over the payload.

usage: /usr/bin/python3 bench/big_checkpoint.py [--scale 1] [--repeat 2]
       [--only sink upload restore mixed] [--parallelism 4 8] [--no-tune]
       [--tmp /tmp] [--json out.json] [--keep]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import benchlib as B
import sync_vs_rclone as S
import fake_gcs  # on sys.path through sync_vs_rclone's benchlib

MiB = 1 << 20
GiB = 1 << 30
BUCKET, PREFIX = S.BUCKET, S.PREFIX


def curl_many(urls_and_args, timeout=600):
    """Run several curl processes at once; (wall seconds, their CPU s)."""
    cpu0 = S.children_cpu()
    t0 = time.monotonic()
    procs = [subprocess.Popen(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}\n"] + a,
                              stdout=subprocess.PIPE, text=True)
             for a in urls_and_args]
    codes = [p.communicate(timeout=timeout)[0].strip() for p in procs]
    wall = time.monotonic() - t0
    bad = [c for c in codes if not c.startswith("2")]
    if bad:
        raise RuntimeError(f"curl answers {codes}")
    return wall, S.children_cpu() - cpu0


def sink(b, sizes, streams_list, results):
    """(0): what the fake absorbs and serves with no client work at all."""
    total = sizes["big"]
    for n in streams_list:
        part = total // n
        src = os.path.join(b.work, f"sink-{n}.bin")
        S.write_random(src, part)
        base = f"http://127.0.0.1:{b.gcs.port}"
        ups = [["-T", src, "-X", "POST", "-H", "Expect:", "-H", "Content-Type: application/octet-stream",
                f"{base}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=sink/{n}-{i}"]
               for i in range(n)]
        cpu0 = time.process_time()
        wall, _ = curl_many(ups)
        up_cpu = time.process_time() - cpu0
        dwall, down_cpu = None, None
        if not b.gcs_sink:
            downs = [[f"{base}/download/storage/v1/b/{BUCKET}/o/sink%2F{n}-{i}?alt=media"] for i in range(n)]
            cpu0 = time.process_time()
            dwall, _ = curl_many(downs)
            down_cpu = time.process_time() - cpu0
        results.append({"scenario": "sink", "streams": n, "bytes": part * n,
                        "up_mib_s": part * n / MiB / wall, "down_mib_s": part * n / MiB / dwall if dwall else None,
                        "fake_cpu_up": up_cpu, "fake_cpu_down": down_cpu})
        print(f"  (0) fake alone, {n} curl stream(s) of {part / MiB:.0f} MiB: up {part * n / MiB / wall:.0f} MiB/s "
              f"(fake CPU {up_cpu:.1f} s)"
              + (f", down {part * n / MiB / dwall:.0f} MiB/s (fake CPU {down_cpu:.1f} s)" if dwall else ""),
              flush=True)
        b.delete_prefix("sink/")
        os.unlink(src)


def warm_memory(work, nbytes, settle_s):
    """Let memory settle, then write nbytes of zeros to a scratch file and
    delete it, so that the next process to fill the page cache gets pages
    this VM has just used. Here (a VM with a free-page-reporting balloon)
    memory freed for more than ~2 s goes back to the host, and the first
    write to it again costs ~2.5 s of CPU per GiB, against ~0.2 s for pages
    just freed (dd of 4 GiB: 8-11 s cold, 0.7-1.0 s warm). The pause comes
    first: without it the 4 GiB the previous run freed were handed back
    during the next restore, which then ran at half speed (a loop of six
    restores: 1.4, 1.5, then ~3 s each; with the pause, 1.38-1.46 s all).
    Without any of this, a restore's time says more about what ran before
    it than about the tool."""
    time.sleep(settle_s)
    path = os.path.join(work, "warm.scratch")
    block = bytes(4 * MiB)
    with open(path, "wb") as f:
        for _ in range(-(-nbytes // len(block))):
            f.write(block)
    os.unlink(path)        # dirty and deleted: dropped, never written back


def fsync_tree(d):
    """fsync every file under d; seconds taken (what making rclone's copy
    durable costs on top of its wall time)."""
    t0 = time.monotonic()
    for rel in S.tree(d):
        fd = os.open(os.path.join(d, rel), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.monotonic() - t0


def spotvisor_sets(parallelism):
    return ["--set", f"sync-parallelism={parallelism}"]


def run_spotvisor(b, sample, run_id, ckpt, event, parallelism, **match):
    """S.Bench.spotvisor_once with a sync-parallelism of our choosing."""
    orig = b.spotvisor_argv

    def argv(run_id_, ckpt_, state, command):
        a = orig(run_id_, ckpt_, state, command)
        i = a.index("--")
        return a[:i] + spotvisor_sets(parallelism) + a[i:]
    b.spotvisor_argv = argv
    try:
        return b.spotvisor_once(sample, run_id, ckpt, event, **match)
    finally:
        b.spotvisor_argv = orig


def tune_rclone(b, src, candidates, what, make_argv):
    """Each candidate once on `src`; returns (best flags, {flags: wall})."""
    times = {}
    for flags in candidates:
        s = S.Sample("rclone", f"tune-{what}", 0)
        b.rclone(s, make_argv(flags))
        key = " ".join(flags)
        times[key] = None if s.problem else s.wall_s
        print(f"  tune {what}: rclone {key}: " + (f"{s.wall_s:.2f} s" if not s.problem else s.problem), flush=True)
        b.delete_prefix("rclone/tune/")
    ok = {k: v for k, v in times.items() if v is not None}
    best = min(ok, key=ok.get) if ok else " ".join(candidates[0])
    return best.split(), times


def measure_upload(b, key, src, payload, args, rflags, results, keep_last=False):
    for rep in range(args.repeat):
        for tool in S.order(rep):
            runs = [("spotvisor", p) for p in args.parallelism] if tool == "spotvisor" else [("rclone", None)]
            for t, par in runs:
                s = S.Sample(t, key, rep)
                s.payload = payload
                run_id = f"{key}-{rep}-{par}"
                if t == "spotvisor":
                    e = run_spotvisor(b, s, run_id, src, "sync.complete", par, kind="final")
                    if e and e.get("bytes") != payload:
                        s.problem = f"final sync moved {e.get('bytes')} bytes"
                else:
                    b.rclone(s, ["copy", src, b.remote(f"{key}-{rep}")] + rflags)
                report(s, par)
                results.append(row(s, par, rflags if t == "rclone" else None))
                last = rep == args.repeat - 1 and (par is None or par == args.parallelism[-1])
                if not (keep_last and last):
                    b.delete_prefix(f"{PREFIX}/{run_id}/" if t == "spotvisor" else f"rclone/{key}-{rep}/")


def report(s, par):
    gib = s.payload / GiB if s.payload else 0
    cpu_gib = s.client_cpu / gib if gib and s.client_cpu is not None else None
    mibs = s.payload / MiB / s.wall_s if s.wall_s else 0
    label = f"{s.tool}" + (f" (sync-parallelism {par})" if par else "")
    print(f"  {s.scenario:8} rep {s.rep} {label:32} {s.wall_s or 0:7.2f} s {mibs:7.0f} MiB/s, "
          f"{s.requests()} requests, tool CPU {s.client_cpu or 0:.2f} s"
          + (f" ({cpu_gib:.2f} s/GiB)" if cpu_gib is not None else "")
          + f", fake CPU {s.fake_cpu or 0:.2f} s"
          + (f", then fsync {s.fsync_s:.2f} s" if getattr(s, "fsync_s", None) is not None else "")
          + (f"  PROBLEM: {s.problem} (log {s.log})" if s.problem else ""), flush=True)


def row(s, par, rflags):
    gib = s.payload / GiB if s.payload else 0
    return {"scenario": s.scenario, "tool": s.tool, "rep": s.rep, "parallelism": par,
            "rclone_flags": rflags, "wall_s": s.wall_s, "own_s": s.own_s, "payload": s.payload,
            "mib_s": s.payload / MiB / s.wall_s if s.wall_s else None,
            "tool_cpu_s": s.client_cpu, "tool_cpu_s_per_gib": s.client_cpu / gib if gib and s.client_cpu else None,
            "fake_cpu_s": s.fake_cpu, "requests": s.requests(), "hits": s.hits, "problem": s.problem,
            "fsync_s": getattr(s, "fsync_s", None)}


def summary(results):
    import statistics
    print()
    print("Medians (MiB = 2^20 bytes; MiB/s = payload / wall)")
    groups = {}
    for r in results:
        if r["scenario"] == "sink" or r["problem"]:
            continue
        label = r["tool"] + (f" p={r['parallelism']}" if r["parallelism"] else "")
        groups.setdefault(r["scenario"], {}).setdefault(label, []).append(r)
    table = {}
    for sc, by in groups.items():
        for label, rs in by.items():
            wall = statistics.median(x["wall_s"] for x in rs)
            cpu = statistics.median(x["tool_cpu_s_per_gib"] or 0 for x in rs)
            mibs = rs[0]["payload"] / MiB / wall
            table[(sc, label)] = wall
            print(f"  {sc:8} {label:14} {wall:8.2f} s {mibs:8.0f} MiB/s  tool CPU {cpu:.2f} s/GiB"
                  + (f"  rclone flags: {' '.join(rs[0]['rclone_flags'])}" if rs[0]["rclone_flags"] else ""))
        rc = table.get((sc, "rclone"))
        synced = [x["wall_s"] + x["fsync_s"] for x in by.get("rclone", []) if x.get("fsync_s") is not None]
        rcs = statistics.median(synced) if synced else None
        if rcs:
            print(f"  {sc:8} {'rclone + fsync':14} {rcs:8.2f} s {by['rclone'][0]['payload'] / MiB / rcs:8.0f} MiB/s"
                  "  (its files made durable, as spotvisor's are)")
        for label in by:
            if label != "rclone" and rc:
                print(f"  {sc:8} {label:14} rclone/spotvisor throughput: {rc / table[(sc, label)]:.2f}x"
                      + (f", against rclone + fsync {rcs / table[(sc, label)]:.2f}x" if rcs else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="shrink every size (e.g. 0.25)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=("sink", "upload", "restore", "mixed"))
    ap.add_argument("--parallelism", type=int, nargs="+", default=[4, 8],
                    help="spotvisor sync-parallelism values to run (default 4 8)")
    ap.add_argument("--no-tune", action="store_true", help="rclone with --transfers 4 --multi-thread-streams 4")
    ap.add_argument("--tune-scale", type=float, default=0.25)
    ap.add_argument("--rclone", default=shutil.which("rclone") or "rclone")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--sink", action="store_true",
                    help="run the fake as a sink (keeps no uploaded bytes: tests/fakes/README.md): uploads only, "
                         "so the fake's hashing and storing costs less and the tools' own speed shows")
    ap.add_argument("--cold", action="store_true",
                    help="do not settle and warm memory before each restore (see warm_memory: on this VM, "
                         "filling the page cache with memory the host took back costs ~2.5 CPU s/GiB more)")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds to let memory settle before warming it for a restore (default 5: see "
                         "warm_memory)")
    ap.add_argument("--md5", action="store_true",
                    help="let the fake compute MD5 (md5Hash) as Cloud Storage does; by default it runs with "
                         "md5=False, since MD5 (~1.4 CPU s/GiB, one core per stream) is most of what it costs to "
                         "take an upload and neither tool needs it")
    B.add_binary_flags(ap)
    args = ap.parse_args()
    B.check_binaries(args)
    sizes = {"big": int(4 * GiB * args.scale) // MiB * MiB, "mixed_big": int(GiB * args.scale) // MiB * MiB,
             "small_count": max(1, round(1000 * args.scale)), "small_size": 64 * 1024}
    work = tempfile.mkdtemp(prefix="spotvisor-bench-big-", dir=args.tmp)
    os.makedirs(os.path.join(work, "logs"))
    need = sizes["big"] * 3 + sizes["mixed_big"] * 2
    if shutil.disk_usage(work).free < need:
        sys.exit(f"bench: {work} needs {need / GiB:.1f} GiB free")
    rversion = subprocess.run([args.rclone, "version"], capture_output=True, text=True).stdout.split("\n")[0]
    if args.sink:
        bad = set(args.only or ()) - {"sink", "upload", "mixed"}
        if bad or not args.only:
            sys.exit("bench: --sink measures uploads only: give --only with sink, upload and/or mixed")
    gcs = S.FakeGcsServer(buckets=[BUCKET], sink=args.sink, md5=args.md5).start()
    md = B.FakeMetadataServer().start()
    b = S.Bench(args, work, gcs, md)
    b.gcs_sink = args.sink
    print(f"machine: {B.machine()}")
    print(f"spotvisor: {args.spotvisor} (CMAKE_BUILD_TYPE={B.build_type(args.spotvisor)}), "
          f"sync-parallelism {args.parallelism}, other settings default")
    print(f"rclone: {args.rclone} ({rversion})")
    print(f"data in {work} ({B.fs_type(work)}); fake GCS on 127.0.0.1:{gcs.port}"
          + (" as a sink (uploads kept as size and hashes only)" if args.sink else "")
          + (", with MD5" if args.md5 else ", without MD5 (md5=False)") + f"; CRC32C: {fake_gcs.CRC32C_IMPL}",
          flush=True)
    groups = args.only or ("sink", "upload", "restore", "mixed")
    results, tuned = [], {}
    try:
        if "sink" in groups:
            sink(b, sizes, [1, 4], results)
        big = os.path.join(work, "big")
        if {"upload", "restore"} & set(groups):
            os.makedirs(big)
            S.write_random(os.path.join(big, "model.bin"), sizes["big"])
            S.warm(big)
        up_flags, down_flags = ["--transfers", "4"], ["--multi-thread-streams", "4", "--multi-thread-cutoff", "64M"]
        if not args.no_tune and {"upload", "restore", "mixed"} & set(groups):
            small = os.path.join(work, "tune")
            os.makedirs(small)
            S.write_random(os.path.join(small, "model.bin"), int(sizes["big"] * args.tune_scale) // MiB * MiB)
            up_flags, tuned["upload"] = tune_rclone(
                b, small, [["--transfers", str(t)] for t in (4, 8, 16)], "upload",
                lambda f: ["copy", small, b.remote("tune")] + f)
            dst = os.path.join(work, "tune-dst")
            if "restore" in groups:    # never with --sink: a sink serves no bytes
                b.rclone(S.Sample("rclone", "tune-seed", 0), ["copy", small, b.remote("tune-src")])

                def down(f):
                    shutil.rmtree(dst, True)
                    return ["copy", b.remote("tune-src"), dst, "--multi-thread-cutoff", "64M"] + f
                down_flags, tuned["restore"] = tune_rclone(
                    b, small, [["--multi-thread-streams", str(t)] for t in (4, 8, 16)], "restore", down)
                down_flags += ["--multi-thread-cutoff", "64M"]
                b.delete_prefix("rclone/tune-src/")
            shutil.rmtree(small, True)
            shutil.rmtree(dst, True)
        if "upload" in groups or "restore" in groups:
            measure_upload(b, "upload", big, sizes["big"], args, up_flags, results, keep_last=True)
        if "restore" in groups:
            last = args.repeat - 1
            par = args.parallelism[-1]
            src_run = f"upload-{last}-{par}"
            if not args.cold:
                b.before_run = lambda: warm_memory(work, sizes["big"], args.settle)
            for rep in range(args.repeat):
                for tool in S.order(rep):
                    runs = [("spotvisor", p) for p in args.parallelism] if tool == "spotvisor" else [("rclone", None)]
                    for t, p in runs:
                        s = S.Sample(t, "restore", rep)
                        s.payload = sizes["big"]
                        dst = os.path.join(work, f"restore-{t}-{rep}-{p}")
                        os.makedirs(dst)
                        if t == "spotvisor":
                            try:
                                gcs.delete_object(BUCKET, f"{PREFIX}/{src_run}/DONE")
                            except Exception:
                                pass
                            e = run_spotvisor(b, s, src_run, dst, "restore.complete", p)
                            if e and e.get("bytes") != sizes["big"]:
                                s.problem = f"restore moved {e.get('bytes')} bytes"
                        else:
                            b.rclone(s, ["copy", b.remote(f"upload-{last}"), dst] + down_flags)
                            # spotvisor fsyncs what it restores before using it; rclone does not.
                            s.fsync_s = fsync_tree(dst)
                        if not s.problem and S.same_tree(big, dst):
                            s.problem = f"restored tree differs: {S.same_tree(big, dst)}"
                        report(s, p)
                        results.append(row(s, p, down_flags if t == "rclone" else None))
                        shutil.rmtree(dst, True)
            b.before_run = None
        b.delete_prefix(f"{PREFIX}/")
        b.delete_prefix("rclone/")
        shutil.rmtree(big, True)
        if "mixed" in groups:
            mixed = os.path.join(work, "mixed")
            S.make_set(mixed, [sizes["mixed_big"]], sizes["small_count"], sizes["small_size"])
            S.warm(mixed)
            payload = sum(S.tree(mixed).values())
            measure_upload(b, "mixed", mixed, payload, args, up_flags, results)
            shutil.rmtree(mixed, True)
    finally:
        gcs.stop()
        md.stop()
    summary(results)
    if tuned:
        print(f"rclone tuning (wall s at --tune-scale {args.tune_scale}): {json.dumps(tuned)}")
    problems = [r for r in results if r.get("problem")]
    print(f"problems: {len(problems)}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": B.machine(), "rclone": rversion, "sizes": sizes, "tuned": tuned,
                       "results": results}, out, indent=1)
    if args.keep or problems:
        print(f"logs kept in {work}/logs")
        for name in os.listdir(work):
            if name != "logs":
                shutil.rmtree(os.path.join(work, name), True)
    else:
        shutil.rmtree(work, True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
