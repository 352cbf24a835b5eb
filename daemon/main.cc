// The spotvisor command line: argument parsing and help only; everything it
// does lives in lib/.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "app/engine.h"
#include "app/launch_command.h"
#include "app/runs_command.h"
#include "app/status_command.h"
#include "common/duration.h"
#include "common/memory.h"
#include "common/strings.h"
#include "config/config_file.h"
#include "config/keys.h"
#include "output/utf8.h"
#include "sync/sync_engine.h"

namespace {

using spotvisor::EngineOptions;
using spotvisor::Mode;

constexpr int kExitUsage = 64;  // EX_USAGE

const char* const kUsage =
    "spotvisor: supervises a training job on a preemptible/Spot VM: starts it at boot,\n"
    "stops it gracefully on preemption, and turns the VM off when the work is done.\n"
    "\n"
    "Usage:\n"
    "  spotvisor daemon [--config FILE]      run as the systemd service\n"
    "  spotvisor run [--config FILE] [--set KEY=VALUE]... [-- COMMAND ARGS...]\n"
    "                                        run a job in the foreground\n"
    "  spotvisor config [--config FILE] [--set KEY=VALUE]... [--json] [-- COMMAND ARGS...]\n"
    "                                        show the resolved configuration\n"
    "  spotvisor config --template [--set KEY=VALUE]...\n"
    "                                        print a config file with every key\n"
    "  spotvisor status [--state-dir DIR] [--config FILE] [--json]\n"
    "                                        show the running daemon's state\n"
    "  spotvisor sync [--state-dir DIR] [--config FILE] [--timeout DURATION]\n"
    "                                        sync checkpoints to the bucket now\n"
    "  spotvisor release [--state-dir DIR] [--config FILE]\n"
    "                                        end an on-failure-hold now\n"
    "  spotvisor checkpoint --done [--dir DIR]\n"
    "                                        (from the trainer) the checkpoint is complete\n"
    "  spotvisor gang-host                   (run by spotvisor) a gang member's stand-in for the\n"
    "                                        command with gang-launch = leader\n"
    "  spotvisor runs [--json] [--access-token-command CMD] [--storage-endpoint URL]\n"
    "                 gs|s3://BUCKET/PREFIX\n"
    "                                        (on a laptop) list the runs under a prefix\n"
    "  spotvisor pull [--sequence N] [--access-token-command CMD] gs|s3://BUCKET/PREFIX/RUN_ID [DIR]\n"
    "                                        (on a laptop) download a run's newest checkpoint\n"
    "  spotvisor gc (--keep N | --older-than DURATION) [--delete] gs|s3://BUCKET/PREFIX\n"
    "                                        (on a laptop) remove old runs (a dry run by default)\n"
    "  spotvisor launch --run-id RUN --bucket gs|s3://BUCKET/PREFIX [--dry-run] [OPTIONS] -- COMMAND ARGS...\n"
    "                                        (on a laptop) an unattended run: a template and a MIG (GCE)\n"
    "                                        or a launch template and an Auto Scaling group (EC2)\n"
    "  spotvisor stop [--wait DURATION] gs|s3://BUCKET/PREFIX/RUN_ID\n"
    "                                        (on a laptop) end a run gracefully, wherever it runs\n"
    "  spotvisor version\n"
    "\n"
    "`spotvisor COMMAND --help` describes each command. Configuration keys: `spotvisor config`\n"
    "and docs/configuration.md.\n";

const std::map<std::string, std::string> kHelp = {
    {"daemon",
     "Usage: spotvisor daemon [--config FILE]\n"
     "\n"
     "What systemd runs. Reads the configuration from FILE (default /etc/spotvisor/spotvisor.conf),\n"
     "then project metadata, then instance metadata (spotvisor-KEY attributes; later layers win);\n"
     "on EC2 (cloud = auto | aws) the user data's [spotvisor] section, then instance tags.\n"
     "A metadata service is required: spotvisor retries until one answers, logging why.\n"
     "Starts the trainer unless the VM is already preempted, watches instance/preempted,\n"
     "instance/maintenance-event and instance/upcoming-maintenance, and on preemption, TERMINATE\n"
     "maintenance (at maintenance-stop-before its window when the window is known), a stalled sync\n"
     "with sync-stall-action=stop, SIGINT or SIGTERM stops the trainer: SIGINT, then SIGTERM after\n"
     "stop-timeout, then SIGKILL after kill-timeout.\n"
     "First it mounts the dataset disk, a scratch disk and the bucket if configured; with a\n"
     "bucket it restores the newest complete checkpoint and syncs it periodically and once more\n"
     "at the end. When the run ends it unmounts and performs on-exit (default here: poweroff),\n"
     "except after a preemption or a stop signal. Under systemd (Type=notify) it reports\n"
     "READY, STATUS, STOPPING and feeds the watchdog.\n"
     "Signals: SIGINT/SIGTERM/SIGHUP stop the run (a second one stops faster), SIGQUIT stops it\n"
     "now (as two), SIGUSR1 syncs now, SIGUSR2 ends an on-failure-hold.\n"
     "\n"
     "Exit status: the trainer's (128+N if killed by signal N), 78 for a configuration error,\n"
     "75 if the VM was preempted before the trainer started, 74 if the checkpoint could not be\n"
     "restored, 73 if the trainer succeeded but the final sync failed, 72 if a disk or the\n"
     "bucket could not be mounted, 126/127 if the trainer could not be started.\n"
     "Logs: one JSON object per line on stdout (readable text on a terminal).\n"},
    {"run",
     "Usage: spotvisor run [--config FILE] [--set KEY=VALUE]... [-- COMMAND ARGS...]\n"
     "\n"
     "The same engine as `daemon`, for local use or a startup script. A command after -- overrides\n"
     "the `command` key (exec form: no shell involved). --set overrides any key and may repeat.\n"
     "The metadata server is used when reachable (required when GCE_METADATA_HOST is set).\n"
     "Defaults differ from daemon mode: on-exit = none, workdir = the current directory.\n"
     "Exit status and signals as for `spotvisor daemon --help`.\n"
     "\n"
     "Example: spotvisor run --set stop-timeout=60s -- python train.py --epochs 10\n"},
    {"config",
     "Usage: spotvisor config [--config FILE] [--set KEY=VALUE]... [--json] [-- COMMAND ARGS...]\n"
     "\n"
     "Prints every key with its resolved value and where it came from (default, the file and\n"
     "line, project metadata, instance metadata, command line), with the command as `spotvisor run`\n"
     "would take it (after --, as it would be given there). Problems go to stderr; the exit\n"
     "status is 78 if anything is invalid, else 0.\n"
     "\n"
     "Usage: spotvisor config --template [--set KEY=VALUE]...\n"
     "\n"
     "Prints a configuration file that lists every key with its help and default, commented out;\n"
     "keys given with --set are written uncommented. Reads no file and no metadata. The package's\n"
     "/etc/spotvisor/spotvisor.conf is made this way.\n"},
    {"status",
     "Usage: spotvisor status [--state-dir DIR] [--config FILE] [--json]\n"
     "\n"
     "Prints the running daemon's phase, since when, the trainer's pid and the last event, from\n"
     "STATE_DIR/status.json (state-dir from --state-dir, else the config file, else /run/spotvisor).\n"
     "Exit status: 0 while spotvisor runs, 3 when it is not running, 4 when there is no status.\n"},
    {"sync",
     "Usage: spotvisor sync [--state-dir DIR] [--config FILE] [--timeout DURATION]\n"
     "\n"
     "Asks the running spotvisor to sync checkpoints to its bucket now (the same as sending it\n"
     "SIGUSR1) and waits for the result (default timeout 10m). Exit status: 0 synced, 1 the sync\n"
     "failed, 3 spotvisor is not running, 4 no status, 5 no bucket configured, 6 timed out.\n"},
    {"release",
     "Usage: spotvisor release [--state-dir DIR] [--config FILE]\n"
     "\n"
     "Ends an on-failure-hold now: the held daemon goes on to its on-exit action (the same as\n"
     "sending it SIGUSR2). Exit status: 0 released, 2 nothing is being held, 3 spotvisor is not\n"
     "running, 4 no status.\n"},
    {"gang-host",
     "Usage: spotvisor gang-host\n"
     "\n"
     "What spotvisor runs on a gang member other than rank 0 when gang-launch = leader, in place\n"
     "of the command: only rank 0 runs the command (mpiexec), whose processes reach this VM over\n"
     "ssh. It says so and waits; SIGINT, SIGTERM or SIGHUP (the generation is over) end it with\n"
     "exit status 0. Not meant to be run by hand.\n"},
    {"checkpoint",
     "Usage: spotvisor checkpoint --done [--dir DIR]\n"
     "\n"
     "Run by the trainer right after it has written a whole checkpoint: touches\n"
     "DIR/.spotvisor-complete (DIR: --dir, else $SPOTVISOR_CHECKPOINT_DIR). While that marker is\n"
     "newer than every file in the checkpoint dir, spotvisor may sync the tree at once, without\n"
     "waiting for sync-settle; a file newer than the marker means a save is under way, and the\n"
     "tree is not committed until the marker is touched again. The same from Python:\n"
     "  time.sleep(0.02); pathlib.Path(os.environ[\"SPOTVISOR_CHECKPOINT_MARKER\"]).touch()\n"
     "(the pause puts the marker past the clock tick of the last write: file times advance in\n"
     "ticks of up to 10 ms, and a marker as new as a file does not order them; this command waits\n"
     "for the tick itself).\n"
     "Exit status: 0 marked, 1 the marker could not be written, 64 usage.\n"},
    {"runs",
     "Usage: spotvisor runs [--json] [--access-token-command CMD] [--storage-endpoint URL]\n"
     "                      [--no-group-state] [--compute-endpoint URL] gs://BUCKET[/PREFIX] | s3://BUCKET[/PREFIX]\n"
     "\n"
     "Lists the runs under the prefix (the value of `bucket` the VMs used): run id, state (done,\n"
     "running while a VM holds a live claim on it, run-failed, or how it ended: preempted, failed,\n"
     "stopped, max-runtime, ...; unknown for runs written before status.json existed), exit code,\n"
     "newest commit and its time, the size of that commit's files, the instance that committed it;\n"
     "from the run's boot records: BOOTS, PREEMPTED, VM_HOURS, LOST (what preempted boots left\n"
     "uncommitted) and GROUP (the newest boot's MIG or Auto Scaling group). GROUP_NOW asks that\n"
     "group how it is now: \"M of T\" (M members, target size or desired capacity T), \"gone\" (it no\n"
     "longer exists), \"?\" (it could not be asked; why is said on stderr). --no-group-state: the\n"
     "bucket only. --json: each boot, how it ended, its VM seconds and the work it left\n"
     "uncommitted; boot_summary.group_state; the size of all the run's objects. With no runs at the\n"
     "prefix, it says where runs are one level down. Never writes. file:///PATH works too.\n"
     "Credentials: --access-token-command (e.g. \"gcloud auth print-access-token\"), else\n"
     "Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, else gcloud's\n"
     "application_default_credentials.json: a user login or a service-account key), else the metadata\n"
     "server on a VM. --storage-endpoint URL: a private Cloud Storage endpoint (the config key\n"
     "storage-endpoint); STORAGE_EMULATOR_HOST wins over it and turns authentication off.\n"
     "--compute-endpoint URL: the Compute API's (a MIG's state needs compute.instanceGroupManagers.get).\n"
     "s3://: credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), else\n"
     "an EC2 instance role; the region from AWS_REGION or AWS_DEFAULT_REGION (else us-east-1; a\n"
     "bucket elsewhere is followed); AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for an S3-compatible\n"
     "store (path-style); an Auto Scaling group's state needs autoscaling:DescribeAutoScalingGroups\n"
     "(AWS_ENDPOINT_URL_AUTO_SCALING). Tokens and keys are never printed.\n"
     "Exit status: 0 listed, 1 the bucket could not be read, 64 usage.\n"},
    {"pull",
     "Usage: spotvisor pull [--sequence N] [--access-token-command CMD] [--storage-endpoint URL]\n"
     "                      gs://BUCKET[/PREFIX]/RUN_ID | s3://BUCKET[/PREFIX]/RUN_ID [DIR]\n"
     "\n"
     "Downloads the run's newest committed checkpoint into DIR (default ./RUN_ID) under the\n"
     "trainer's own file names: in parallel (files of 64 MiB and up as byte ranges at once),\n"
     "each file checked against the manifest's crc32c; a pull longer than 5 s says how far it\n"
     "is on stderr every 5 s. Files already there with the right size and\n"
     "crc32c are kept, so an interrupted pull goes on where it stopped. DIR ends up holding\n"
     "exactly that commit: files an earlier pull put there, unedited, that it no longer holds\n"
     "(or holds in another version) are removed; anything else that is not the commit's (a file\n"
     "edited there, or one no pull put there) is moved to DIR/.spotvisor-replaced/TIME-PID/; the\n"
     "summary says how many of each. --sequence N: only that\n"
     "commit (the bucket keeps a run's newest commit only; an older one is an error saying so).\n"
     "Only reads the bucket. Credentials as for\n"
     "`spotvisor runs`. Exit status: 0 pulled, 1 failed (files pulled so far stay), 64 usage.\n"},
    {"gc",
     "Usage: spotvisor gc [--keep N] [--older-than DURATION] [--delete] [--access-token-command CMD]\n"
     "                    [--storage-endpoint URL] gs://BUCKET[/PREFIX] | s3://BUCKET[/PREFIX]\n"
     "\n"
     "Removes old runs under the prefix: those beyond the N most recent (--keep) and/or whose\n"
     "last commit or status is older than DURATION (--older-than 30d); with both, a run must be\n"
     "beyond both (every run, kept or not, counts toward --keep, newest first). A run is never\n"
     "removed while it is live: while a VM holds a claim on it (RUN_ID/claims/, written before\n"
     "its restore by every VM and every rank of a gang, renewed, and expiring by itself when\n"
     "nobody renews it, run-claim-ttl; 2 minutes are added for clocks that differ), while a claim\n"
     "cannot be read, while its status says running, or while its last commit is younger than a\n"
     "claim's lifetime (unless it is done). A run of unknown age is removed only by --keep.\n"
     "Without --delete it only says what it would delete (a dry run).\n"
     "With --delete each run's manifest goes first, then its other objects (each deleted only if\n"
     "unchanged since listed). Credentials as for `spotvisor runs` (deleting needs\n"
     "storage.objects.delete, or s3:DeleteObject).\n"
     "Exit status: 0 listed or deleted, 1 a failure, 64 usage.\n"},
    {"stop",
     "Usage: spotvisor stop [--wait DURATION] [--access-token-command CMD] [--storage-endpoint URL]\n"
     "                      gs://BUCKET[/PREFIX]/RUN_ID | s3://BUCKET[/PREFIX]/RUN_ID\n"
     "\n"
     "Ends a run gracefully from a laptop, on whichever VM it runs: writes RUN_ID/STOP in the\n"
     "bucket (only if there is none yet). Every VM of the run looks for it every\n"
     "stop-check-interval (30 s by default) while its trainer may run; it then stops the trainer\n"
     "(SIGINT, the stop ladder), runs the final sync, ends the run as stop-requested and runs\n"
     "on-exit (in a group: leaves it, so the group goes to 0). A later boot of the run ends at once\n"
     "without training. Deleting RUN_ID/STOP lets the run go on. --wait DURATION: then wait until\n"
     "the run's status.json says it ended (or it is done), saying what it waits for every 10 s.\n"
     "Credentials as for `spotvisor runs` (writing needs storage.objects.create, or s3:PutObject).\n"
     "Exit status: 0 requested (and, with --wait, ended), 1 failed, 2 --wait ran out, 64 usage.\n"},
    {"launch",
     "Usage: spotvisor launch --project PROJECT (--zone ZONE | --region REGION [--zones Z,Z]) --run-id RUN\n"
     "                        --bucket gs://BUCKET[/PREFIX] (--image-family FAMILY [--image-project P] | --image IMAGE)\n"
     "                        [--machine-type n1-standard-4] [--accelerator type=TYPE[,count=N]]\n"
     "                        [--boot-disk-size 100] [--dataset-disk DISK | --dataset-snapshot S | --dataset-image I]\n"
     "                        [--service-account EMAIL] [--scopes cloud-platform]\n"
     "                        [--size 1] [--termination-action DELETE|STOP] [--set KEY=VALUE]...\n"
     "                        [--compute-endpoint URL] [--access-token-command CMD] [--dry-run]\n"
     "                        -- COMMAND ARGS...\n"
     "       spotvisor launch --region REGION --run-id RUN --bucket s3://BUCKET[/PREFIX] --image AMI_ID\n"
     "                        --instance-types TYPE[,TYPE...] --subnets SUBNET[,SUBNET...]\n"
     "                        [--instance-profile NAME|ARN] [--security-groups SG[,SG...]] [--key-name KEY]\n"
     "                        [--allocation-strategy capacity-optimized] [--terminating-hook-timeout 5m]\n"
     "                        [--size 1] [--set KEY=VALUE]... [--dry-run] -- COMMAND ARGS...\n"
     "\n"
     "Creates what an unattended run needs and nothing more; the bucket's scheme picks the cloud.\n"
     "\n"
     "GCE (gs://): an instance template named RUN (Spot, the termination action, the machine, GPUs,\n"
     "the image, the service account and its scopes, and the metadata spotvisor-run-id,\n"
     "spotvisor-bucket, spotvisor-command (exec form), spotvisor-KEY for each --set,\n"
     "enable-guest-attributes) and a managed instance group named RUN of --size VMs (1; N for a gang)\n"
     "in the zone, or across the region (--zones: only these zones of it). --dataset-disk DISK\n"
     "attaches an existing zonal disk read-only (its device name DISK, spotvisor-dataset-disk=DISK); a\n"
     "regional group is refused with it, as a zonal disk cannot follow a VM into another zone.\n"
     "--dataset-disk regions/REGION/disks/DISK attaches a regional disk read-only; a regional group\n"
     "then needs --zones, the disk's two replica zones. --dataset-snapshot / --dataset-image give each\n"
     "VM a disk of its own made in its zone (device name dataset, deleted with the VM), which works in\n"
     "a regional group too. Each request carries a requestId, so a retry\n"
     "never creates a thing twice. Credentials: --access-token-command, else Application Default\n"
     "Credentials (a service-account key is asked for the cloud-platform scope), else the metadata\n"
     "server; they need roles/compute.instanceAdmin.v1 and roles/iam.serviceAccountUser on the VMs'\n"
     "service account.\n"
     "\n"
     "EC2 (s3://): a launch template named RUN (the AMI, the instance profile, security groups,\n"
     "instance-metadata tags on, shutdown terminates, the user data's [spotvisor] section with\n"
     "run-id, bucket, group, command and each --set) and an Auto Scaling group named RUN: minimum 0,\n"
     "desired and maximum --size, Spot only across --instance-types and --subnets (one per\n"
     "Availability Zone) with --allocation-strategy, capacity rebalancing off, and a terminating\n"
     "lifecycle hook (spotvisor-final-sync, CONTINUE after --terminating-hook-timeout; 0: none) that\n"
     "spotvisor completes after its final sync. The template's create carries a ClientToken; a group\n"
     "that a retried create finds already made is taken when its spotvisor-launch tag is this launch's.\n"
     "Credentials:\n"
     "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), else the instance role; endpoints\n"
     "from AWS_ENDPOINT_URL_EC2, AWS_ENDPOINT_URL_AUTO_SCALING, AWS_ENDPOINT_URL. They need\n"
     "ec2:CreateLaunchTemplate, ec2:DeleteLaunchTemplate, ec2:CreateTags, ec2:RunInstances,\n"
     "autoscaling:CreateAutoScalingGroup, autoscaling:DescribeAutoScalingGroups,\n"
     "autoscaling:CreateOrUpdateTags, autoscaling:PutLifecycleHook and iam:PassRole on the instance\n"
     "profile's role.\n"
     "\n"
     "On both the group brings a preempted VM back, and the VM leaves the group when the run is over\n"
     "(docs/unattended.md); the image must have spotvisor baked in. A template made for a group that\n"
     "could not be made is deleted again. A flag of the other cloud is a usage error. --dry-run\n"
     "prints the API requests instead and needs no credentials.\n"
     "Exit status: 0 launched (or printed), 1 an API call failed, 64 usage.\n"},
    {"version", "Usage: spotvisor version\n\nPrints spotvisor's version.\n"},
};

struct Args {
  std::string command;
  EngineOptions engine;
  bool json = false;
  bool template_ = false;
  std::string state_dir;
  std::chrono::milliseconds timeout{600'000};
  bool done = false;
  std::string dir;
  std::vector<std::string> positional;  // runs, pull
  spotvisor::RemoteOptions remote;
  std::optional<std::int64_t> sequence;
  std::optional<int> keep;
  std::optional<std::chrono::milliseconds> older_than;
  std::optional<std::chrono::milliseconds> wait;  // stop --wait
  spotvisor::LaunchOptions launch;
  bool apply = false;  // gc --delete
};

int Usage(const std::string& problem) {
  std::fprintf(stderr, "spotvisor: %s\n\n%s", problem.c_str(), kUsage);
  return kExitUsage;
}

// A mistake in one command's arguments: the problem and where the help is,
// not the whole usage (issue #32).
int CommandUsage(const std::string& command, const std::string& problem) {
  std::fprintf(stderr, "spotvisor %s: %s\n(`spotvisor %s --help` lists its options)\n", command.c_str(), problem.c_str(),
               command.c_str());
  return kExitUsage;
}

// Returns -1 to go on, else an exit code.
int Parse(int argc, char** argv, Args& a) {
  if (argc < 2) return Usage("missing command");
  a.command = argv[1];
  if (a.command == "--help" || a.command == "-h" || a.command == "help") {
    if (argc > 2 && kHelp.count(argv[2])) {
      std::fputs(kHelp.at(argv[2]).c_str(), stdout);
    } else {
      std::fputs(kUsage, stdout);
    }
    return 0;
  }
  if (a.command == "--version") a.command = "version";
  if (!kHelp.count(a.command)) return Usage("unknown command \"" + a.command + "\"");
  a.engine.mode = a.command == "daemon" ? Mode::kDaemon : a.command == "run" ? Mode::kRun : Mode::kConfig;
  auto allowed = [&](const std::string& flag) {
    static const std::map<std::string, std::vector<std::string>> kFlags = {
        {"daemon", {"--config"}},
        {"run", {"--config", "--set", "--"}},
        {"config", {"--config", "--set", "--json", "--template", "--"}},
        {"status", {"--config", "--state-dir", "--json"}},
        {"sync", {"--config", "--state-dir", "--timeout"}},
        {"release", {"--config", "--state-dir"}},
        {"checkpoint", {"--done", "--dir"}},
        {"gang-host", {}},
        {"runs", {"--json", "--access-token-command", "--storage-endpoint", "--compute-endpoint", "--no-group-state"}},
        {"pull", {"--sequence", "--access-token-command", "--storage-endpoint"}},
        {"gc", {"--keep", "--older-than", "--delete", "--access-token-command", "--storage-endpoint"}},
        {"stop", {"--wait", "--access-token-command", "--storage-endpoint"}},
        {"launch", {"--project", "--zone", "--region", "--zones", "--run-id", "--bucket", "--image", "--image-family",
                    "--image-project", "--machine-type", "--accelerator", "--boot-disk-size", "--dataset-disk",
                    "--dataset-snapshot", "--dataset-image", "--service-account",
                    "--scopes", "--size", "--termination-action", "--set", "--compute-endpoint",
                    "--access-token-command", "--dry-run", "--instance-types", "--subnets", "--instance-profile",
                    "--security-groups", "--key-name", "--allocation-strategy", "--terminating-hook-timeout", "--"}},
        {"version", {}},
    };
    auto const& v = kFlags.at(a.command);
    return std::find(v.begin(), v.end(), flag) != v.end();
  };
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kHelp.at(a.command).c_str(), stdout);
      return 0;
    }
    if ((a.command == "runs" || a.command == "pull" || a.command == "gc" || a.command == "stop") && arg.rfind("-", 0) != 0) {
      a.positional.push_back(arg);
      continue;
    }
    std::string value;
    auto eq = arg.find('=');
    std::string flag = (arg.rfind("--", 0) == 0 && eq != std::string::npos) ? arg.substr(0, eq) : arg;
    if (!allowed(flag)) {
      if ((a.command == "run" || a.command == "config") && arg.rfind("-", 0) != 0) {
        // `spotvisor run python3 train.py`: the command goes after --.
        std::string rest;
        for (int j = i; j < argc && j < i + 6; ++j) rest += std::string(" ") + spotvisor::output::EscapeInvalidUtf8(argv[j]);
        if (argc > i + 6) rest += " ...";
        return CommandUsage(a.command, "\"" + spotvisor::output::EscapeInvalidUtf8(arg) + "\" is not an option: the trainer's command goes "
                                       "after --, as in: spotvisor " + a.command + " --" + rest);
      }
      return CommandUsage(a.command, "unknown option \"" + spotvisor::output::EscapeInvalidUtf8(arg) + "\"");
    }
    if (a.command == "launch") a.launch.flags_given.push_back(flag);
    if (flag == "--dry-run") {
      a.launch.dry_run = true;
      continue;
    }
    if (flag == "--") {
      for (++i; i < argc; ++i) a.engine.command.push_back(argv[i]);
      if (a.engine.command.empty()) return Usage("nothing after --");
      break;
    }
    if (flag == "--json") {
      a.json = true;
      continue;
    }
    if (flag == "--no-group-state") {
      a.remote.group_state = false;
      continue;
    }
    if (flag == "--template") {
      a.template_ = true;
      continue;
    }
    if (flag == "--done") {
      a.done = true;
      continue;
    }
    if (flag == "--delete") {
      a.apply = true;
      continue;
    }
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Usage(flag + " needs a value");
    }
    if (flag == "--config") {
      a.engine.config_path = value;
      a.engine.config_path_given = true;
    } else if (flag == "--state-dir") {
      a.state_dir = value;
    } else if (flag == "--dir") {
      a.dir = value;
    } else if (flag == "--access-token-command") {
      a.remote.access_token_command = value;
    } else if (flag == "--storage-endpoint") {
      a.remote.storage_endpoint = value;
    } else if (flag == "--compute-endpoint" && a.command == "runs") {
      a.remote.compute_endpoint = value;
    } else if (flag == "--keep") {
      auto n = spotvisor::ParseUint64(value);
      if (!n || *n > 1'000'000) return Usage("--keep: \"" + value + "\" is not a number of runs (0, 1, ...)");
      a.keep = static_cast<int>(*n);
    } else if (flag == "--wait") {
      auto d = spotvisor::ParseDuration(value);
      if (!d.ok()) return Usage("--wait: " + d.status().message());
      a.wait = *d;
    } else if (flag == "--older-than") {
      auto d = spotvisor::ParseDuration(value);
      if (!d.ok()) return Usage("--older-than: " + d.status().message());
      a.older_than = *d;
    } else if (flag == "--sequence") {
      auto n = spotvisor::ParseUint64(value);
      if (!n || *n < 1 || *n > static_cast<std::uint64_t>(INT64_MAX)) {
        return Usage("--sequence: \"" + value + "\" is not a commit number (1, 2, ...)");
      }
      a.sequence = static_cast<std::int64_t>(*n);
    } else if (flag == "--timeout") {
      auto d = spotvisor::ParseDuration(value);
      if (!d.ok()) return Usage("--timeout: " + d.status().message());
      a.timeout = *d;
    } else if (a.command == "launch" && flag != "--set" && flag != "--access-token-command") {
      auto& l = a.launch;
      auto number = [&](int& out, int hi) {
        auto n = spotvisor::ParseUint64(value);
        if (!n || *n > static_cast<std::uint64_t>(hi)) return false;
        out = static_cast<int>(*n);
        return true;
      };
      if (flag == "--project") l.project = value;
      else if (flag == "--zone") l.zone = value;
      else if (flag == "--region") l.region = value;
      else if (flag == "--run-id") l.run_id = value;
      else if (flag == "--bucket") l.bucket = value;
      else if (flag == "--image") l.image = value;
      else if (flag == "--image-family") l.image_family = value;
      else if (flag == "--image-project") l.image_project = value;
      else if (flag == "--machine-type") l.machine_type = value;
      else if (flag == "--accelerator") l.accelerator = value;
      else if (flag == "--dataset-disk") l.dataset_disk = value;
      else if (flag == "--dataset-snapshot") l.dataset_snapshot = value;
      else if (flag == "--dataset-image") l.dataset_image = value;
      else if (flag == "--service-account") l.service_account = value;
      else if (flag == "--scopes") l.scopes = value;
      else if (flag == "--termination-action") l.termination_action = value;
      else if (flag == "--compute-endpoint") l.compute_endpoint = value;
      else if (flag == "--instance-profile") l.instance_profile = value;
      else if (flag == "--key-name") l.key_name = value;
      else if (flag == "--allocation-strategy") l.allocation_strategy = value;
      else if (flag == "--instance-types" || flag == "--subnets" || flag == "--security-groups" || flag == "--zones") {
        auto& list = flag == "--instance-types" ? l.instance_types
                     : flag == "--subnets"      ? l.subnets
                     : flag == "--zones"        ? l.zones
                                                : l.security_groups;
        for (auto const& part : spotvisor::SplitOn(value, ',')) {
          auto item = std::string(spotvisor::Trim(part));
          if (item.empty()) return CommandUsage("launch", flag + ": an empty item in \"" + value + "\"");
          list.push_back(item);
        }
      } else if (flag == "--terminating-hook-timeout") {
        auto d = spotvisor::ParseDuration(value);
        if (!d.ok() || *d > std::chrono::hours(2)) return CommandUsage("launch", "--terminating-hook-timeout: a duration (5m), at most 2h; 0 for no hook");
        l.terminating_hook_timeout = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(*d).count());
      } else if (flag == "--boot-disk-size") {
        if (!number(l.boot_disk_gb, 65536)) return CommandUsage("launch", "--boot-disk-size: a number of GB");
      } else if (flag == "--size") {
        if (!number(l.size, 1000)) return CommandUsage("launch", "--size: a number of VMs");
      }
    } else if (flag == "--set") {
      auto kv = spotvisor::ParseSetFlag(value);
      if (!kv.ok()) return Usage(kv.status().message());
      if (a.command == "launch") a.launch.sets[kv->first] = kv->second;
      a.engine.sets.push_back(*kv);
      if (kv->first == "log-format") {
        a.engine.log_format = kv->second == "text"   ? spotvisor::LogFormat::kText
                              : kv->second == "json" ? spotvisor::LogFormat::kJson
                                                     : spotvisor::LogFormat::kAuto;
      }
    }
  }
  return -1;
}

// status needs only state-dir: from the flag, else the file, else the default.
std::string StateDir(const Args& a) {
  if (!a.state_dir.empty()) return a.state_dir;
  auto entries = spotvisor::ReadConfigFile(a.engine.config_path);
  std::string dir = spotvisor::FindKey("state-dir")->default_value;
  if (entries.ok()) {
    for (auto const& e : *entries) {
      if (e.key == "state-dir") dir = e.value;
    }
  }
  return dir;
}

// gang-launch = leader: a member's stand-in for the command while rank 0's
// mpiexec runs this VM's share over ssh. Ends (0) when told to stop.
int GangHost() {
  sigset_t stop;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "?");
  };
  std::printf("spotvisor gang-host: rank %s of gang %s (generation %s) hosts rank 0's processes: they arrive over "
              "ssh from %s\n",
              env("SPOTVISOR_GANG_RANK").c_str(), env("SPOTVISOR_GANG").c_str(), env("SPOTVISOR_GANG_GENERATION").c_str(),
              env("MASTER_ADDR").c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("spotvisor gang-host: %s: the generation is over\n", strsignal(sig));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spotvisor::ConfigureMemory();
  Args a;
  if (int rc = Parse(argc, argv, a); rc >= 0) return rc;
  if (a.command == "version") {
    std::printf("spotvisor %s\n", SPOTVISOR_VERSION);
    return 0;
  }
  if (a.command == "status") return spotvisor::PrintStatus(StateDir(a), a.json);
  if (a.command == "runs") {
    if (a.positional.size() != 1) return Usage("spotvisor runs: give one gs://BUCKET[/PREFIX]");
    return spotvisor::ListRuns(a.positional[0], a.remote, a.json);
  }
  if (a.command == "gc") {
    if (a.positional.size() != 1) return Usage("spotvisor gc: give one gs://BUCKET[/PREFIX]");
    return spotvisor::GcRuns(a.positional[0], a.keep, a.older_than, a.apply, a.remote);
  }
  if (a.command == "pull") {
    if (a.positional.empty() || a.positional.size() > 2) return Usage("spotvisor pull: give gs://BUCKET[/PREFIX]/RUN_ID [DIR]");
    return spotvisor::PullRun(a.positional[0], a.positional.size() > 1 ? a.positional[1] : "", a.sequence, a.remote);
  }
  if (a.command == "launch") {
    a.launch.command = a.engine.command;
    a.launch.access_token_command = a.remote.access_token_command;
    return spotvisor::Launch(a.launch);
  }
  if (a.command == "stop") {
    if (a.positional.size() != 1) return Usage("spotvisor stop: give one gs://BUCKET[/PREFIX]/RUN_ID");
    return spotvisor::StopRun(a.positional[0], a.wait, a.remote);
  }
  if (a.command == "gang-host") return GangHost();
  if (a.command == "sync") return spotvisor::RequestSync(StateDir(a), a.timeout);
  if (a.command == "release") return spotvisor::RequestRelease(StateDir(a));
  if (a.command == "checkpoint") {
    if (!a.done) return Usage("spotvisor checkpoint: say --done (the only action so far)");
    std::string dir = a.dir;
    if (dir.empty()) {
      const char* env = std::getenv("SPOTVISOR_CHECKPOINT_DIR");
      if (env == nullptr || *env == '\0') return Usage("spotvisor checkpoint: no --dir and no $SPOTVISOR_CHECKPOINT_DIR");
      dir = env;
    }
    auto s = spotvisor::MarkCheckpointComplete(dir);
    if (!s.ok()) {
      std::fprintf(stderr, "spotvisor checkpoint: %s\n", s.message().c_str());
      return 1;
    }
    return 0;
  }
  if (a.command == "config" && a.template_) {
    if (a.json || a.engine.config_path_given) return Usage("config --template takes only --set");
    auto t = spotvisor::ConfigTemplate(a.engine.sets);
    if (!t.ok()) return Usage("config --template: " + t.status().message());
    std::fputs(t->c_str(), stdout);
    return 0;
  }
  if (a.command == "config") return spotvisor::PrintConfig(a.engine, a.json);
  return spotvisor::RunEngine(a.engine);
}
