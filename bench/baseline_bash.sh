#!/usr/bin/env bash
# The preemption handling of the 2020 blog post that spotvisor replaces
# ("Deep learning on GCP as cheaply as possible", seed 000), reproduced as
# faithfully as a benchmark allows.
#
# usage: baseline_bash.sh METADATA_HOST:PORT TRAINER [ARGS...]
#
# Changes from the blog, all forced by benchmarking:
#   - metadata.google.internal is replaced by METADATA_HOST:PORT (the fake);
#   - `python train.py` is replaced by the trainer given as arguments;
#   - the last line (`wait "$pid_train"`) is ours: the blog's script went on
#     at once (copy results, power off), but the benchmark needs to know when
#     the trainer is gone.
# Everything else, `set -eu`, the unquoted $api, no last_etag, no timeout,
# `wait -n` and a single SIGINT to the trainer's pid, is the blog's.
# The blog's unquoted $api and unused pid_preempted are kept on purpose.
# shellcheck disable=SC2086,SC2034
set -eu

metadata_host="$1"
shift

"$@" &  # python train.py &
pid_train="$!"

api="http://${metadata_host}/computeMetadata/v1/instance/preempted?wait_for_change=true"
curl -sS $api -H "Metadata-Flavor: Google" &
pid_preempted="$!"

wait -n
kill -SIGINT $pid_train

wait "$pid_train"  # benchmark only, see above
