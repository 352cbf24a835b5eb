#!/usr/bin/env bash
# The README's demo: builds spotvisor, starts the fake GCE metadata server,
# runs examples/train.py under `spotvisor run` configured through instance
# metadata, preempts the VM half-way (instance/preempted=TRUE, as GCE does),
# and shows what happened. Nothing here talks to Google Cloud.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/install-deps.sh

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "building spotvisor (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >/dev/null
cmake --build build --target spotvisor >/dev/null
sv=$root/build/daemon/spotvisor

work=$(mktemp -d /tmp/spotvisor-demo.XXXXXX)
cleanup() {
  [ -n "${fake_pid:-}" ] && kill "$fake_pid" 2>/dev/null || true
  [ -n "${sv_pid:-}" ] && kill "$sv_pid" 2>/dev/null || true
}
trap cleanup EXIT

say "starting the fake GCE metadata server on loopback"
python3 tests/fakes/fake_metadata.py serve --port 0 --port-file "$work/port" --instance-name demo-vm \
  --attr "spotvisor-command=python3 $root/examples/train.py --epochs 6" \
  --attr "spotvisor-stop-timeout=10s" >"$work/fake.log" 2>&1 &
fake_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "fake metadata server did not start:"; cat "$work/fake.log"; exit 1; }
port=$(cat "$work/port")
export GCE_METADATA_HOST=127.0.0.1:$port
ctl() { python3 tests/fakes/fake_metadata.py ctl --port "$port" "$@" >/dev/null; }
echo "instance metadata: spotvisor-command=\"python3 examples/train.py --epochs 6\", spotvisor-stop-timeout=10s"

say "spotvisor run: the trainer starts, its output is logged (progress bars collapsed)"
"$sv" run --set log-format=text --set "state-dir=$work/state" --set "checkpoint-dir=$work/checkpoints" &
sv_pid=$!

# Preempt half-way: once the trainer has finished its third epoch.
for _ in $(seq 600); do
  grep -q '"epoch": 4' "$work/checkpoints/model.ckpt" 2>/dev/null && break
  kill -0 "$sv_pid" 2>/dev/null || break
  sleep 0.1
done
say "GCE preempts the VM: instance/preempted = TRUE"
ctl set instance/preempted TRUE

set +e
wait "$sv_pid"
code=$?
set -e
sv_pid=

say "what happened"
echo "spotvisor exit status: $code (the trainer's own exit code after SIGINT)"
"$sv" status --state-dir "$work/state" || true
echo "checkpoint left for the next VM: $(cat "$work/checkpoints/model.ckpt")"
cat <<MSG

spotvisor saw instance/preempted flip on its long-poll, sent SIGINT to the
trainer's process group, the trainer saved a checkpoint and exited, and the
run ended with reason=preempted. Under systemd (\`spotvisor daemon\`) it would
now power the VM off (on-exit=poweroff); \`spotvisor run\` defaults to none.
Uploading that checkpoint to Cloud Storage and restoring it on the next boot
is the next step (issue #3).
MSG
rm -rf "$work"
