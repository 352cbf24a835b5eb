#!/usr/bin/env bash
# The README's demo: builds spotvisor, starts the fake GCE metadata server,
# runs examples/train.py under `spotvisor run` configured through instance
# metadata with a (local) bucket, preempts the VM half-way
# (instance/preempted=TRUE, as GCE does), "boots" a second VM that restores
# the checkpoint and finishes the run, and shows what happened. Nothing here
# talks to Google Cloud.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/install-deps.sh

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "building spotvisor (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF -DSPOTVISOR_WERROR=OFF >/dev/null
cmake --build build --target spotvisor >/dev/null
sv=$root/build/daemon/spotvisor

work=$(mktemp -d /tmp/spotvisor-demo.XXXXXX)
cleanup() {
  [ -n "${fake_pid:-}" ] && kill "$fake_pid" 2>/dev/null || true
  [ -n "${sv_pid:-}" ] && kill "$sv_pid" 2>/dev/null || true
}
trap cleanup EXIT

say "starting the fake GCE metadata server on loopback"
bucket=$work/bucket
python3 tests/fakes/fake_metadata.py serve --port 0 --port-file "$work/port" --instance-name demo-vm \
  --attr "spotvisor-command=python3 $root/examples/train.py --epochs 6" \
  --attr "spotvisor-stop-timeout=10s" --attr "spotvisor-bucket=file://$bucket" \
  --attr "spotvisor-sync-interval=2s" --attr "spotvisor-sync-settle=200ms" >"$work/fake.log" 2>&1 &
fake_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "fake metadata server did not start:"; cat "$work/fake.log"; exit 1; }
port=$(cat "$work/port")
export GCE_METADATA_HOST=127.0.0.1:$port
ctl() { python3 tests/fakes/fake_metadata.py ctl --port "$port" "$@" >/dev/null; }
cat <<MSG
instance metadata:
  spotvisor-command       = python3 examples/train.py --epochs 6
  spotvisor-stop-timeout  = 10s
  spotvisor-bucket        = file://$bucket   (a local stand-in for gs://BUCKET)
  spotvisor-sync-interval = 2s
  spotvisor-sync-settle   = 200ms (files younger than this wait for the next sync)
MSG

boot() {  # one VM boot: its own empty local checkpoint disk
  "$sv" run --set log-format=text --set "state-dir=$work/state" --set "checkpoint-dir=$work/$1" &
  sv_pid=$!
}

say "VM #1 boots: restore (nothing yet), the trainer starts, checkpoints are synced every 2s"
boot disk1
# Preempt half-way: once the trainer has finished its third epoch.
for _ in $(seq 600); do
  grep -q '"epoch": 4' "$work/disk1/model.ckpt" 2>/dev/null && break
  kill -0 "$sv_pid" 2>/dev/null || break
  sleep 0.1
done
say "GCE preempts VM #1: instance/preempted = TRUE"
ctl set instance/preempted TRUE
set +e; wait "$sv_pid"; code1=$?; set -e; sv_pid=

say "VM #2 boots with the same run-id and an empty disk: restore, resume, run to completion"
ctl set instance/preempted FALSE
boot disk2
set +e; wait "$sv_pid"; code2=$?; set -e; sv_pid=

say "what happened"
echo "VM #1: spotvisor exit status $code1 (the trainer's own exit code after SIGINT); the final sync"
echo "       uploaded the checkpoint the trainer saved on SIGINT."
echo "VM #2: restored it, started the trainer with SPOTVISOR_RESUMED=1, exit status $code2."
echo
echo "the bucket now holds (under RUN_ID demo-vm/):"
(cd "$bucket/demo-vm" && find . -type f ! -name .lock | sort | sed 's|^\./|  |')
echo
echo "DONE marker: $(cat "$bucket/demo-vm/DONE")"
"$sv" status --state-dir "$work/state" || true
cat <<MSG

Under systemd (\`spotvisor daemon\`) each VM would then power itself off (on-exit=poweroff;
\`spotvisor run\` defaults to none), and a third boot with this run-id would find DONE and not
train again. With spotvisor-bucket=gs://BUCKET the same happens through the Cloud Storage JSON API.
MSG
rm -rf "$work"
