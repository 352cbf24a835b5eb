#!/usr/bin/env bash
# The usual hand-written EC2 Spot interruption handler, as a baseline: the
# loop aws-node-termination-handler runs (IMDSv2 token, then GET
# spot/instance-action every 2 s with a 2 s timeout), written in bash with
# curl, then one SIGINT to the trainer.
#
# usage: baseline_ec2_poll.sh IMDS_ENDPOINT TRAINER [ARGS...]
set -u
imds="$1"
shift

"$@" &  # python train.py &
pid_train="$!"

token=""
while :; do
  [ -n "$token" ] || token=$(curl -sf -m 2 -X PUT "$imds/latest/api/token" \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 21600") || token=""
  if [ -n "$token" ] && curl -sf -m 2 -o /dev/null -H "X-aws-ec2-metadata-token: $token" \
      "$imds/latest/meta-data/spot/instance-action"; then
    break
  fi
  sleep 2
done
kill -SIGINT "$pid_train"
wait "$pid_train"  # benchmark only: to know when the trainer is gone
