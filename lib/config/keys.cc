#include "config/keys.h"

namespace spotvisor {

const std::vector<KeySpec>& AllKeys() {
  static const std::vector<KeySpec> keys = {
      {"command", "",
       "The trainer: shell form (run by /bin/sh -c) or a JSON array for exec form"},
      {"user", "",
       "Run the trainer as this user, with its groups and HOME (default: the user spotvisor runs as)"},
      {"workdir", "", "The trainer's working directory, created if missing (default: the user's home)"},
      {"env", "", "Extra environment, one NAME=value per line"},
      {"checkpoint-dir", "/var/lib/spotvisor/checkpoints",
       "Where the trainer writes checkpoints (created); passed as SPOTVISOR_CHECKPOINT_DIR"},
      {"run-id", "", "Names this run in logs and storage (default: the instance name)"},
      {"state-dir", "/run/spotvisor", "Where status.json is kept for `spotvisor status`"},
      {"stop-timeout", "20s", "SIGINT -> SIGTERM escalation delay"},
      {"kill-timeout", "5s", "SIGTERM -> SIGKILL escalation delay"},
      {"on-exit", "",
       "What to do after the run: poweroff | stop | delete | none (default: poweroff for `daemon`, none for `run`)"},
      {"on-exit-success", "", "on-exit after a run that completed (empty: on-exit)"},
      {"on-exit-failure", "", "on-exit after a run that failed (empty: on-exit)"},
      {"compute-endpoint", "https://compute.googleapis.com/compute/v1",
       "Compute Engine API endpoint for on-exit stop | delete; request paths are appended to it"},
      {"group", "auto",
       "The VM's group, which brings it back after a preemption: auto (GCE: the created-by attribute; EC2: the tag "
       "aws:autoscaling:groupName) | none | a MIG (projects/P/zones/Z/instanceGroupManagers/N, or regions/R) | an Auto "
       "Scaling group's name. In a group, an ending that should stop the billing leaves the group instead of on-exit"},
      {"group-delete-when-empty", "false",
       "true: the last VM of a managed instance group or Auto Scaling group deletes the group and its template when the "
       "run is over, then itself, so a finished run leaves nothing but the bucket"},
      {"max-failed-boots", "3",
       "After this many failed boots of the run in a row (trainer failed; restore, mount or sync failed), the run is "
       "marked failed (RUN_ID/FAILED) and every later boot ends at once (0: no limit; 0-1000)"},
      {"stop-check-interval", "30s",
       "How often a VM looks for RUN_ID/STOP in the bucket (`spotvisor stop`), while the trainer may run (0: never)"},
      {"shutdown-command", "systemctl poweroff", "How on-exit=poweroff powers off (run by /bin/sh -c)"},
      {"restart", "never",
       "never | on-failure: start a trainer that crashed (non-zero exit not caused by our stop) again"},
      {"max-restarts", "3", "How many times a crashed trainer is started again (0-1000)"},
      {"restart-delay", "10s",
       "Wait before a restart; doubled for each crash within 60s of its start, up to 5m"},
      {"max-runtime", "0",
       "Stop the trainer gracefully this long after spotvisor started, with a final sync (0: no limit)"},
      {"maintenance-stop-lead", "0s",
       "After a TERMINATE maintenance notice: sync at once, stop the trainer this much later (0: right away)"},
      {"maintenance-stop-before", "5m",
       "When instance/upcoming-maintenance gives the window of a maintenance that will terminate the VM: sync at once, "
       "stop the trainer this long before the window opens"},
      {"idle-timeout", "0",
       "End the run after this long with no activity by the trainer's process tree (0: never); for interactive servers"},
      {"idle-threshold", "5",
       "Percent of one CPU core (or of a GPU) above which the trainer counts as active (1-100)"},
      {"cloud", "auto",
       "auto | gce | aws: whose metadata service configures this VM and sends its preemption notices; auto asks both "
       "at boot and takes the one that answers (GCE_METADATA_HOST or AWS_EC2_METADATA_SERVICE_ENDPOINT set picks "
       "that one). Read from the config file or the command line only"},
      {"preemption-notice", "0s",
       "The VM's --preemption-notice-duration (e.g. 120s): preempted=TRUE comes that long before the power button, so "
       "the final sync after a preemption has that much more time (0: none, or what the metadata server says)"},
      {"preemption-stop-lead", "0s",
       "For VMs created with --preemption-notice-duration: on preemption, sync at once and stop the trainer this much "
       "later (0: right away)"},
      {"on-exit-timeout", "60s",
       "The whole on-exit budget: the action (API stop/delete or shutdown-command) gets half, then shutdown-command is "
       "retried in the rest, then (daemon only) the VM is powered off by force"},
      {"preemption-window", "30s",
       "How long the cloud lets a preempted VM run after the power button (GCE Spot: 30s): the final sync must end "
       "3s before that"},
      {"on-failure-hold", "0",
       "After a failed run, keep the VM up this long before on-exit, for debugging (spotvisor release ends it early)"},
      {"bucket", "",
       "Where checkpoints are kept: gs://BUCKET[/PREFIX], s3://BUCKET[/PREFIX] or file:///PATH (empty: no sync); objects go under PREFIX/RUN_ID/"},
      {"sync-interval", "10m", "How often checkpoints are synced while training (0: only the final sync)"},
      {"sync-alert-after", "",
       "Warn (sync.stalled) when the bucket has not caught up with the checkpoint dir for this long; ERROR at twice "
       "that (empty: 3 x sync-interval; 0: never)"},
      {"sync-stall-action", "warn",
       "warn | stop: at twice sync-alert-after, stop the trainer gracefully and end the run as sync-stalled (on-exit "
       "runs): a run that cannot make its progress durable is burning money"},
      {"checkpoint-report-interval", "1m",
       "How often a checkpoint.age event reports the newest commit's age and the bytes not yet committed (0: never)"},
      {"sync-parallelism", "4",
       "How many transfers run at once: whole files, and the parts and ranges of large ones (1-64); the final sync "
       "after a preemption or maintenance notice may use twice as many (at most 64)"},
      {"sync-parallel-min-size", "64M",
       "Files at least this large are uploaded as parts in parallel and composed into one object (a parallel "
       "composite upload), and restored as byte ranges in parallel (0: never)"},
      {"run-claim-ttl", "10m",
       "How long this VM's claim on the run (RUN_ID/claims/ in the bucket) lives unless renewed; renewed every third "
       "of it, from before the restore until the run ends, so `spotvisor gc` never deletes a live run (1m to 24h)"},
      {"sync-settle", "10s",
       "Files changed more recently than this are left for the next periodic sync (a save may still be under way, "
       "pauses included); framework saves, the completion marker and one-file savers are judged sooner"},
      {"storage-endpoint", "https://storage.googleapis.com",
       "Cloud Storage JSON API endpoint; STORAGE_EMULATOR_HOST overrides it and turns authentication off"},
      {"sync-via", "api",
       "api | mount: sync checkpoints through the Cloud Storage API, or by copying them into bucket-mount (same layout)"},
      {"dataset-disk", "",
       "Device name of the dataset disk (gcloud --disk=...,device-name=NAME), mounted read-only on dataset-dir before the "
       "trainer starts; a /dev/... path also works (empty: none)"},
      {"dataset-dir", "/mnt/dataset", "Where the dataset disk is mounted; passed as SPOTVISOR_DATASET_DIR"},
      {"dataset-mount-options", "",
       "Extra mount options for the dataset disk, comma-separated (always read-only; noload for ext3/4, norecovery for xfs)"},
      {"scratch-disk", "",
       "Device name of a local SSD or scratch disk (e.g. local-nvme-ssd-0): formatted ext4 if blank, mounted read-write "
       "on scratch-dir (empty: none)"},
      {"scratch-dir", "/mnt/scratch",
       "Where the scratch disk is mounted; passed as SPOTVISOR_SCRATCH_DIR; checkpoint-dir may be under it"},
      {"bucket-mount", "",
       "Mount the bucket of `bucket` on this directory with mount-driver; passed as SPOTVISOR_OUTPUT_DIR (empty: no mount)"},
      {"mount-driver", "gcsfuse", "gcsfuse | rclone: the FUSE daemon that mounts bucket-mount"},
      {"mount-options", "", "Extra command-line flags for the mount driver, separated by spaces"},
      {"mount-timeout", "60s", "How long to wait for a disk to appear, and for the bucket mount to be ready"},
      {"log-to", "auto",
       "auto (on GCE: the Cloud Logging API and stdout; on EC2: CloudWatch Logs and stdout; elsewhere stdout) | "
       "stdout | api (and stdout) | journald (native journal fields instead of stdout)"},
      {"logging-endpoint", "https://logging.googleapis.com",
       "Cloud Logging API endpoint; /v2/entries:write is appended"},
      {"log-group", "spotvisor",
       "On EC2: the CloudWatch Logs log group (created if missing); streams INSTANCE_ID/spotvisor and "
       "INSTANCE_ID/spotvisor-trainer"},
      {"log-labels", "", "Extra labels on every log entry, one NAME=value per line (e.g. experiment=lr-sweep)"},
      {"log-format", "auto",
       "auto (text on a terminal, else JSON lines) | json | text"},
      {"progress-interval", "5s",
       "Log a \\r-rewritten progress line at most this often"},
      {"gang", "",
       "Name of the gang this VM trains in: gang-size VMs that form through etcd, start their trainers together and "
       "stop together (docs/gang.md); also the default run-id (empty: no gang)"},
      {"gang-size", "0", "How many VMs the gang has (2-1024); needed with gang"},
      {"gang-etcd", "",
       "The etcd endpoints the gang coordinates through, separated by commas or spaces (http://HOST:2379 or "
       "https://HOST:2379); tried in order"},
      {"gang-etcd-ca", "", "PEM file of the CA that signed etcd's certificate (https endpoints)"},
      {"gang-etcd-cert", "", "PEM client certificate, for etcd's --client-cert-auth (with gang-etcd-key)"},
      {"gang-etcd-key", "", "PEM private key of gang-etcd-cert"},
      {"gang-etcd-user", "", "etcd user, when etcd has auth enabled (with gang-etcd-password)"},
      {"gang-etcd-password", "", "Password of gang-etcd-user; never logged or shown", true},
      {"gang-launch", "each",
       "each: every member runs the command (torch.distributed / DDP style); leader: only rank 0 runs it (MPI "
       "style: mpiexec --hostfile $SPOTVISOR_GANG_HOSTFILE), the others host its processes over ssh, trusting a "
       "fresh key for each generation"},
      {"gang-ssh-port", "22", "gang-launch = leader: the port sshd listens on, on every member (given to mpiexec's ssh)"},
      {"gang-ssh-authorized-keys", "",
       "gang-launch = leader: the authorized_keys file the members add the leader's key to, for the generation "
       "(default: the trainer user's ~/.ssh/authorized_keys; another one must be DIR/.ssh/authorized_keys)"},
      {"gang-form-timeout", "10m",
       "How long to wait for all gang-size members before giving up: then on-exit, so the others do not wait forever"},
      {"gang-on-loss", "stop",
       "stop: when a member is lost (preempted, failed, gone) every member stops its trainer, syncs and runs on-exit; "
       "wait: the others stop, sync, and wait up to gang-reform-timeout for the gang to form again, then resume"},
      {"gang-reform-timeout", "30m",
       "With gang-on-loss = wait: how long the members that are left wait for the gang to form again (a lost VM "
       "restarted or recreated) before they give up and run on-exit"},
      {"gang-checkpoint", "leader",
       "leader: rank 0's checkpoint-dir is synced and every member restores it; all: every rank syncs its own under "
       "RUN_ID/rank-K/, and a generation's checkpoint counts only once every rank's final sync of it committed"},
      {"gang-lease-ttl", "10s",
       "A member that stops renewing its etcd lease for this long is gone, and ends the generation (2s-5m)"},
      {"gang-address", "",
       "The address the other members reach this VM at (default: its private IP from the metadata server)"},
      {"gang-master-port", "29500", "MASTER_PORT given to the trainers (torch.distributed's rendezvous on rank 0)"},
      {"metadata-watch-timeout", "60s",
       "timeout_sec of each metadata long-poll; the HTTP timeout adds a margin of up to 10s"},
  };
  return keys;
}

const KeySpec* FindKey(const std::string& name) {
  for (auto const& k : AllKeys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> AllKeyNames() {
  std::vector<std::string> names;
  for (auto const& k : AllKeys()) names.push_back(k.name);
  return names;
}

}  // namespace spotvisor
