"""What the soak's trainer writes, and how anyone decides whether a set of
checkpoint files is a state that trainer produced.

Shared by the trainer (`trainer.py`, which resumes from what it finds) and the
checker (`soak.py`, which judges what the bucket holds), so both agree on
every byte.

Every file of the save of step N at relative path REL is a deterministic
function of (content seed, N, REL): a header line `step=N path=REL
size=S\\n`, then padding up to S bytes cut from a 64 KiB block drawn from a
PRNG seeded with (seed, N, REL). A torn file (shorter than S), a file
holding bytes of two saves, or one from another step or path is told apart
by its header, its size or its CRC32C.

Layouts (the `layout` key of a trainer config):

  single   `latest.ckpt`, rewritten in place (open with O_TRUNC, write)
  pair     `model.pt` then `optimizer.pt`, each rewritten in place, with a
           pause between them (torch.save twice)
  hf       Hugging Face Trainer: `checkpoint-N/` with `model.safetensors`,
           `optimizer.pt`, `scheduler.pt`, then `trainer_state.json` last;
           then the oldest directories beyond save_total_limit=2 are removed
           with shutil.rmtree
  rename   `model.bin` then `state.json`, each written to `NAME.tmp` and
           renamed over NAME (the "atomic save" habit)

With `marker` on, the trainer touches the completion marker after every
complete save ($SPOTVISOR_CHECKPOINT_MARKER, else
$SPOTVISOR_CHECKPOINT_DIR/.spotvisor-complete).
"""
import os
import random
import re

MARKER_NAME = ".spotvisor-complete"
SPOTVISOR_OWN = ".spotvisor-"  # names spotvisor uses for itself in the checkpoint dir
LAYOUTS = ("single", "pair", "hf", "rename")
HF_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")
HF_KEEP = 2  # save_total_limit
TMP_SUFFIX = ".tmp"
HEADER_MAX = 200
_HEADER = re.compile(rb'(?:step=(\d+) path=(\S+) size=(\d+)\n|\{"h": "step=(\d+) path=(\S+) size=(\d+)", "pad": ")')
_HF_DIR = re.compile(r"checkpoint-(\d+)")
_BLOCK = 64 * 1024


def save_files(layout, step):
    """Relative paths written by the save of `step`, in the order written."""
    if layout == "single":
        return ["latest.ckpt"]
    if layout == "pair":
        return ["model.pt", "optimizer.pt"]
    if layout == "hf":
        return [f"checkpoint-{step}/{name}" for name in HF_FILES]
    if layout == "rename":
        return ["model.bin", "state.json"]
    raise ValueError(f"unknown layout {layout!r}")


def file_size(sizes, rel, step):
    """The size of REL in the save of `step`: the run's base size for its
    file name, plus a few bytes that vary with the step (so an in-place
    rewrite sometimes changes the size, sometimes not)."""
    base = sizes[os.path.basename(rel)]
    return base + (step * 2654435761 + len(rel)) % 4093


def content(seed, step, rel, size):
    """The bytes of REL in the save of `step` (see the module's docstring).
    `trainer_state.json` is JSON, as Hugging Face writes it (spotvisor checks
    that it parses): `{"h": "HEADER", "pad": "HEX"}`, S bytes in all."""
    rng = random.Random(f"{seed}:{step}:{rel}")
    if os.path.basename(rel) == "trainer_state.json":
        head = f'{{"h": "step={step} path={rel} size={size}", "pad": "'.encode()
        need = max(0, size - len(head) - 2)
        return head + rng.randbytes(need // 2 + 1).hex().encode()[:need] + b'"}'
    header = f"step={step} path={rel} size={size}\n".encode()
    if size <= len(header):
        return header
    block = rng.randbytes(_BLOCK)
    need = size - len(header)
    return header + (block * (need // _BLOCK + 1))[:need]


def parse_header(head):
    """(step, path, size) from a file's first bytes, or None."""
    m = _HEADER.match(head[:HEADER_MAX])
    if not m:
        return None
    g = m.groups()[:3] if m.group(1) is not None else m.groups()[3:]
    return int(g[0]), g[1].decode("utf-8", "replace"), int(g[2])


class Judge:
    """Decides what a file's bytes are, for one trainer config (content seed
    and sizes). Expected CRC32Cs are memoised: the checker sees the same
    (step, path) many times."""

    def __init__(self, config, crc_fn):
        self.seed = config["content_seed"]
        self.sizes = config["sizes"]
        self.layout = config["layout"]
        self.crc = crc_fn
        self._memo = {}

    def expected(self, step, rel):
        key = (step, rel)
        if key not in self._memo:
            size = file_size(self.sizes, rel, step)
            self._memo[key] = (size, self.crc(content(self.seed, step, rel, size)))
        return self._memo[key]

    def file_step(self, rel, size, crc, head):
        """(step, None) if these bytes are exactly what the trainer wrote at
        REL for some step; else (None, why). `head` is the first bytes,
        `size` and `crc` describe the whole file."""
        parsed = parse_header(head)
        if parsed is None:
            if size == 0:
                return None, f"{rel}: empty (0 bytes)"
            return None, f"{rel}: no trainer header ({size} bytes starting {head[:40]!r})"
        step, path, want_size = parsed
        logical = rel[:-len(TMP_SUFFIX)] if self.layout == "rename" and rel.endswith(TMP_SUFFIX) else rel
        if path != logical:
            return None, f"{rel}: holds the bytes of {path} (step {step})"
        exp_size, exp_crc = self.expected(step, logical)
        if want_size != exp_size:
            return None, f"{rel}: header says {want_size} bytes, step {step} wrote {exp_size}"
        if size != exp_size:
            return None, (f"{rel}: torn: {size} of the {exp_size} bytes of step {step}" if size < exp_size else
                          f"{rel}: {size} bytes, but step {step} wrote {exp_size}")
        if crc != exp_crc:
            return None, f"{rel}: starts as step {step} but is not what step {step} wrote (mixed saves?)"
        return step, None

    def state(self, files):
        """Judges a set of checkpoint files: `files` maps a relative path to
        (step, why) as file_step returned. Returns (step, problems): the step
        of the newest complete save the files hold (None: no checkpoint at
        all) and everything wrong with them. The marker and the trainer's
        temporary files are not part of a checkpoint and are ignored."""
        problems = []
        files = {rel: v for rel, v in files.items()
                 if os.path.basename(rel) != MARKER_NAME
                 and not (self.layout == "rename" and rel.endswith(TMP_SUFFIX))}
        for rel, (_, why) in sorted(files.items()):
            if why:
                problems.append(why)
        if self.layout == "hf":
            return self._hf_state(files, problems)
        names = save_files(self.layout, 0)
        for rel in sorted(set(files) - set(names)):
            problems.append(f"{rel}: not a file this trainer writes")
        present = [n for n in names if n in files]
        if not present:
            return None, problems
        steps = {n: files[n][0] for n in present}
        if len(present) < len(names):
            problems.append(f"incomplete save: {', '.join(present)} without "
                            f"{', '.join(n for n in names if n not in files)}")
        if len(set(steps.values())) > 1:
            problems.append("files of different saves: " + ", ".join(f"{n}@{s}" for n, s in steps.items()))
        primary = steps[names[0]] if names[0] in steps else None
        return (primary if primary is not None else -1), problems

    def _hf_state(self, files, problems):
        dirs = {}
        for rel in files:
            top, _, rest = rel.partition("/")
            m = _HF_DIR.fullmatch(top)
            if not m or rest not in HF_FILES:
                problems.append(f"{rel}: not a file this trainer writes")
                continue
            dirs.setdefault(int(m.group(1)), {})[rest] = files[rel][0]
        complete = []
        for n, got in sorted(dirs.items()):
            missing = [f for f in HF_FILES if f not in got]
            wrong = [f"{f}@{s}" for f, s in got.items() if s is not None and s != n]
            if missing:
                problems.append(f"checkpoint-{n}/ incomplete: no {', '.join(missing)}")
            if wrong:
                problems.append(f"checkpoint-{n}/ holds files of other saves: {', '.join(wrong)}")
            if not missing and not wrong and all(s == n for s in got.values()):
                complete.append(n)
        if not dirs:
            return None, problems
        return (max(complete) if complete else -1), problems


def read_local(judge, ckpt_dir):
    """Judges the files of a local checkpoint dir (the trainer's resume, the
    soak's look at a VM's disk). Returns (step, problems, newest_mtime_ns):
    newest_mtime_ns is the newest modification among the files of the
    newest complete save (to compare with the marker's)."""
    files, mtimes = {}, {}
    for root, dirs, names in os.walk(ckpt_dir):
        dirs[:] = [d for d in dirs if not d.startswith(SPOTVISOR_OWN)]
        for name in names:
            if (name.startswith(SPOTVISOR_OWN) and name != MARKER_NAME) or SPOTVISOR_OWN + "restore." in name:
                continue  # spotvisor's own files in the checkpoint dir (staging copies, restores under way)
            full = os.path.join(root, name)
            rel = os.path.relpath(full, ckpt_dir)
            try:
                with open(full, "rb") as f:
                    data = f.read()
                mtimes[rel] = os.stat(full).st_mtime_ns
            except OSError:
                continue  # removed while we looked (rotation)
            files[rel] = judge.file_step(rel, len(data), judge.crc(data), data[:HEADER_MAX])
    step, problems = judge.state(files)
    newest = 0
    if step is not None and step >= 0:
        for rel in save_files(judge.layout, step):
            newest = max(newest, mtimes.get(rel, 0))
    return step, problems, newest
