#include "config/config.h"

#include <catch2/catch.hpp>

#include "config/config_file.h"
#include "config/keys.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

ConfigInputs Base() {
  ConfigInputs in;
  in.file_path = "/etc/spotvisor/spotvisor.conf";
  in.dynamic_defaults = {{"user", "root"}, {"run-id", "vm-1"}, {"on-exit", "poweroff"}};
  in.instance_attributes = {{"spotvisor-command", "python train.py"}};
  return in;
}

TEST_CASE("the file format: comments, quoting, escapes") {
  auto r = ParseConfigText(
      "# a comment\n"
      "\n"
      "command = python train.py --lr 0.1 # not a comment\n"
      "  env = \"A=1\\nB=two words\\n\"\n"
      "shutdown-command=\"echo \\\"bye\\\" \\\\o/\"\n",
      "f.conf");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK((*r)[0].key == "command");
  CHECK((*r)[0].value == "python train.py --lr 0.1 # not a comment");
  CHECK((*r)[1].value == "A=1\nB=two words\n");
  CHECK((*r)[1].line == 4);
  CHECK((*r)[2].value == "echo \"bye\" \\o/");
}

TEST_CASE("file syntax errors name the file and line") {
  CHECK(ParseConfigText("a = 1\nnonsense\n", "f.conf").status().message() ==
        "f.conf:2: expected `key = value`, got \"nonsense\"");
  CHECK(ParseConfigText("a = \"open\n", "f.conf").status().message() ==
        "f.conf:1: unterminated quoted value (missing closing \")");
  CHECK(ParseConfigText("a = \"x\\q\"\n", "f.conf").status().message() ==
        "f.conf:1: unknown escape \\q (use \\n, \\t, \\\" or \\\\)");
  CHECK_FALSE(ParseConfigText("= 1\n", "f.conf").ok());
}

TEST_CASE("every bad line of a file is an error of its own; the good lines are still read") {
  auto p = ParseConfigLines("command = train\nnonsense\nb = \"open\nc = 3\n= 1\n", "f.conf");
  REQUIRE(p.errors.size() == 3);
  CHECK(p.errors[0] == "f.conf:2: expected `key = value`, got \"nonsense\"");
  CHECK(p.errors[1] == "f.conf:3: unterminated quoted value (missing closing \")");
  CHECK(p.errors[2] == "f.conf:5: missing key before '='");
  REQUIRE(p.entries.size() == 2);
  CHECK((p.entries[0].key == "command" && p.entries[1].key == "c" && p.entries[1].line == 4));
}

TEST_CASE("a key given twice in the file is an error naming both lines") {
  auto in = Base();
  in.file_entries = {{"stop-timeout", "5m", 3}, {"stop-timeout", "1m", 9}};
  auto r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find(":9 stop-timeout: given again (first on line 3)") != std::string::npos);
  CHECK_FALSE(r.config.has_value());
}

TEST_CASE("layers: default < file < project < instance < command line, with sources") {
  auto in = Base();
  in.file_entries = {{"stop-timeout", "30s", 3}, {"kill-timeout", "7s", 4}, {"workdir", "/srv", 5}};
  in.project_attributes = {{"spotvisor-stop-timeout", "40s"}, {"spotvisor-kill-timeout", "8s"}};
  in.instance_attributes["spotvisor-stop-timeout"] = "50s";
  in.cli_sets = {{"kill-timeout", "9s"}};
  auto r = ResolveConfig(in);
  REQUIRE(r.errors.empty());
  REQUIRE(r.config);
  CHECK(r.config->stop_timeout == 50s);
  CHECK(r.config->kill_timeout == 9s);
  CHECK(r.config->workdir == "/srv");
  CHECK(r.values["stop-timeout"].source == ConfigSource::kInstanceMetadata);
  CHECK(r.values["stop-timeout"].origin == "instance metadata spotvisor-stop-timeout");
  CHECK(r.values["kill-timeout"].source == ConfigSource::kCommandLine);
  CHECK(r.values["workdir"].origin == "/etc/spotvisor/spotvisor.conf:5 workdir");
  CHECK(r.values["state-dir"].source == ConfigSource::kDefault);
  CHECK(r.config->on_exit == OnExit::kPoweroff);
  CHECK(r.config->run_id == "vm-1");
  CHECK(r.config->checkpoint_dir == "/var/lib/spotvisor/checkpoints");
  CHECK(r.config->shutdown_command == "systemctl poweroff");
}

TEST_CASE("a bad value names the source, the key and the problem") {
  auto in = Base();
  in.instance_attributes["spotvisor-stop-timeout"] = "20 sec";
  auto r = ResolveConfig(in);
  REQUIRE_FALSE(r.config);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0] == "instance metadata spotvisor-stop-timeout: \"20 sec\" is not a duration (try 20s, 15m or 1h30m)");
}

TEST_CASE("every bad key is reported, not only the first") {
  auto in = Base();
  in.file_entries = {{"kill-timeout", "soon", 2}, {"on-exit", "reboot", 3}, {"state-dir", "relative/dir", 4}};
  auto r = ResolveConfig(in);
  CHECK(r.errors.size() == 3);
  CHECK(r.errors[2].find("/etc/spotvisor/spotvisor.conf:3 on-exit: \"reboot\" is not one of: poweroff, stop, delete, none") !=
        std::string::npos);
}

TEST_CASE("unknown spotvisor-* attributes warn with a suggestion, other attributes are ignored") {
  auto in = Base();
  in.instance_attributes["spotvisor-stop-timout"] = "30s";
  in.instance_attributes["startup-script"] = "#!/bin/bash";
  in.project_attributes["spotvisor-frobnicate"] = "1";
  auto r = ResolveConfig(in);
  CHECK(r.errors.empty());
  REQUIRE(r.warnings.size() == 2);
  CHECK(r.warnings[0] == "project metadata spotvisor-frobnicate: unknown spotvisor attribute, ignored");
  CHECK(r.warnings[1] ==
        "instance metadata spotvisor-stop-timout: unknown spotvisor attribute, ignored (did you mean spotvisor-stop-timeout?)");
}

TEST_CASE("an unknown key in the file warns, on the command line it is an error") {
  auto in = Base();
  in.file_entries = {{"comand", "x", 7}};
  in.cli_sets = {{"stop-timout", "3s"}};
  auto r = ResolveConfig(in);
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0] == "/etc/spotvisor/spotvisor.conf:7: unknown key \"comand\", ignored (did you mean command?)");
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0] == "--set stop-timout: unknown key (did you mean stop-timeout?)");
}

TEST_CASE("command: shell form, exec form, and the command after --") {
  auto in = Base();
  auto r = ResolveConfig(in);
  CHECK(r.config->argv == std::vector<std::string>{"/bin/sh", "-c", "python train.py"});
  CHECK_FALSE(r.config->exec_form);

  in.instance_attributes["spotvisor-command"] = R"(["python", "train.py", "--dir=${SPOTVISOR_CHECKPOINT_DIR}", "--lr=${LR}"])";
  in.instance_attributes["spotvisor-env"] = "LR=0.01\n\n# comment\nEMPTY=";
  r = ResolveConfig(in);
  REQUIRE(r.errors.empty());
  CHECK(r.config->argv ==
        std::vector<std::string>{"python", "train.py", "--dir=/var/lib/spotvisor/checkpoints", "--lr=0.01"});
  CHECK(r.config->env == std::vector<std::pair<std::string, std::string>>{{"LR", "0.01"}, {"EMPTY", ""}});

  in.cli_command = {"./run.sh", "a b"};
  r = ResolveConfig(in);
  CHECK(r.config->argv == std::vector<std::string>{"./run.sh", "a b"});
  CHECK(r.values["command"].source == ConfigSource::kCommandLine);
}

TEST_CASE("shell form leaves ${NAME} to the shell, which quotes it properly") {
  auto in = Base();
  in.instance_attributes["spotvisor-command"] = "python train.py --lr ${LR}";
  in.instance_attributes["spotvisor-env"] = "LR=0.01";
  auto r = ResolveConfig(in);
  CHECK(r.config->argv[2] == "python train.py --lr ${LR}");
}

TEST_CASE("command errors: empty, missing, malformed exec form, undefined reference") {
  auto in = Base();
  in.instance_attributes["spotvisor-command"] = "   ";
  auto r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("no command to run") != std::string::npos);

  in.instance_attributes.erase("spotvisor-command");
  CHECK(ResolveConfig(in).errors.size() == 1);

  in.instance_attributes["spotvisor-command"] = R"(["python", 3])";
  r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].rfind("instance metadata spotvisor-command: ", 0) == 0);

  in.instance_attributes["spotvisor-command"] = R"(["python", "${NOPE}"])";
  r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("${NOPE} is not defined in env") != std::string::npos);
}

TEST_CASE("env lines must be NAME=value") {
  auto in = Base();
  in.instance_attributes["spotvisor-env"] = "GOOD=1\n1BAD=2\nno equals";
  auto r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors[0] == "instance metadata spotvisor-env: line 2 \"1BAD=2\" is not NAME=value (one per line, NAME of letters, digits and _)");
}

TEST_CASE("run-id must be usable in object names and labels") {
  auto in = Base();
  in.instance_attributes["spotvisor-run-id"] = "../etc";
  CHECK(ResolveConfig(in).errors.size() == 1);
  in.instance_attributes["spotvisor-run-id"] = "exp-42_lr0.1";
  CHECK(ResolveConfig(in).errors.empty());
}

TEST_CASE("parsing of the set flag") {
  CHECK(*ParseSetFlag("a=b=c") == std::make_pair(std::string("a"), std::string("b=c")));
  CHECK_FALSE(ParseSetFlag("novalue").ok());
  CHECK_FALSE(ParseSetFlag("=x").ok());
}

TEST_CASE("the trainer's spotvisor variables include Vertex AI's name") {
  Config c;
  c.run_id = "r";
  c.checkpoint_dir = "/ck";
  auto env = SpotvisorEnv(c);
  CHECK(std::find(env.begin(), env.end(), std::make_pair(std::string("AIP_CHECKPOINT_DIR"), std::string("/ck"))) != env.end());
}

TEST_CASE("the config template lists every key and reads back what was set") {
  auto t = ConfigTemplate({{"user", "spotvisor"},
                           {"env", "A=1\nB=\"two\" \\ three"},
                           {"command", "  python train.py # not a comment"}});
  REQUIRE(t.ok());
  for (auto const& k : AllKeys()) {
    INFO(k.name);
    bool listed = t->find("\n# " + k.name + " = ") != std::string::npos ||
                  t->find("\n" + k.name + " = ") != std::string::npos;
    CHECK(listed);
  }
  auto entries = ParseConfigText(*t, "template");
  REQUIRE(entries.ok());
  std::map<std::string, std::string> got;
  for (auto const& e : *entries) got[e.key] = e.value;
  CHECK(got.size() == 3);
  CHECK(got["user"] == "spotvisor");
  CHECK(got["env"] == "A=1\nB=\"two\" \\ three");
  CHECK(got["command"] == "  python train.py # not a comment");
  // Defaults are shown, commented out, exactly as they parse.
  CHECK(t->find("\n# stop-timeout = 20s\n") != std::string::npos);

  auto bad = ConfigTemplate({{"usr", "x"}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "unknown key \"usr\"");
}


TEST_CASE("mount keys: a daemonizing driver flag, rw on the dataset, a bucket-mount without a gs:// bucket are errors") {
  auto in = Base();
  in.cli_sets = {{"bucket", "gs://results"}, {"bucket-mount", "/mnt/result"}, {"mount-options", "--daemon --stat-cache-ttl 1m"},
                 {"dataset-disk", "data"}, {"dataset-mount-options", "noatime,rw"}};
  auto r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 2);
  auto has = [&](const char* text) {
    return std::any_of(r.errors.begin(), r.errors.end(), [&](auto const& e) { return e.find(text) != std::string::npos; });
  };
  CHECK(has("--set mount-options: \"--daemon\""));
  CHECK(has("--set dataset-mount-options: the dataset disk is always mounted read-only"));

  auto ok = Base();
  ok.cli_sets = {{"bucket", "gs://results/exp"}, {"bucket-mount", "/mnt/result"}, {"mount-options", "--stat-cache-ttl 1m"},
                 {"sync-via", "mount"}};
  auto r2 = ResolveConfig(ok);
  REQUIRE(r2.errors.empty());
  CHECK(r2.config->mount_options == std::vector<std::string>{"--stat-cache-ttl", "1m"});
  CHECK(r2.config->sync_via_mount);

  auto bad = Base();
  bad.cli_sets = {{"bucket", "file:///tmp/b"}, {"bucket-mount", "/mnt/result"}};
  auto r3 = ResolveConfig(bad);
  REQUIRE(r3.errors.size() == 1);
  CHECK(r3.errors[0].find("needs a gs:// bucket") != std::string::npos);
}
}  // namespace
}  // namespace spotvisor

namespace spotvisor {
namespace {

TEST_CASE("outside bytes in the configuration: errors, never exceptions", "[config][issue12]") {
  auto in = Base();
  SECTION("an argument after -- that is not UTF-8 is exec'ed byte for byte") {
    // nlohmann's dump() threw type_error 316 on it: SIGABRT before anything started.
    in.cli_command = {"./train", "--data=/data/caf\xe9", "${SPOTVISOR_RUN_ID}"};
    auto r = ResolveConfig(in);
    REQUIRE(r.errors.empty());
    CHECK(r.config->argv == std::vector<std::string>{"./train", "--data=/data/caf\xe9", "vm-1"});
    CHECK(r.values["command"].value == "[\"./train\",\"--data=/data/caf\xef\xbf\xbd\",\"${SPOTVISOR_RUN_ID}\"]");
  }
  SECTION("a 400-digit duration is a configuration error naming the key") {
    in.instance_attributes["spotvisor-stop-timeout"] = std::string(400, '9') + "s";
    auto r = ResolveConfig(in);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].find("instance metadata spotvisor-stop-timeout: \"99999") == 0);
    CHECK(r.errors[0].find("too long a duration") != std::string::npos);
    CHECK(r.errors[0].size() < 300);
  }
  SECTION("values that are not UTF-8 are quoted escaped in errors") {
    in.instance_attributes["spotvisor-on-exit"] = "stop\xff";
    auto r = ResolveConfig(in);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0] == "instance metadata spotvisor-on-exit: \"stop\\xff\" is not one of: poweroff, stop, delete, none");
  }
  SECTION("a long ${NAME} in exec form does not overflow the stack (std::regex recursed per byte)") {
    in.instance_attributes["spotvisor-command"] = "[\"x\", \"${" + std::string(200'000, 'A') + "}\", \"${\", \"$}\", \"${1}\"]";
    auto r = ResolveConfig(in);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].find("is not defined in env") != std::string::npos);
    in.instance_attributes["spotvisor-command"] = "[\"x\", \"${\", \"a${SPOTVISOR_RUN_ID}b${\", \"${1}\"]";
    r = ResolveConfig(in);
    REQUIRE(r.errors.empty());
    CHECK(r.config->argv == std::vector<std::string>{"x", "${", "avm-1b${", "${1}"});
  }
  SECTION("a long run-id is rejected without std::regex") {
    in.instance_attributes["spotvisor-run-id"] = std::string(1'000'000, 'a');
    auto r = ResolveConfig(in);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].find("is not a valid run id") != std::string::npos);
  }
}

TEST_CASE("a file:// bucket inside checkpoint-dir is a configuration error", "[config][issue12]") {
  auto in = Base();
  in.instance_attributes["spotvisor-checkpoint-dir"] = "/data/ckpt";
  for (auto bucket : {"file:///data/ckpt", "file:///data/ckpt/", "file:///data/ckpt/store", "file:///data/x/../ckpt/s"}) {
    INFO(bucket);
    in.instance_attributes["spotvisor-bucket"] = bucket;
    auto r = ResolveConfig(in);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].find("instance metadata spotvisor-bucket: \"") == 0);
    CHECK(r.errors[0].find("is inside checkpoint-dir /data/ckpt") != std::string::npos);
  }
  for (auto bucket : {"file:///data/ckpt2", "file:///data", "gs://bucket/data/ckpt"}) {
    INFO(bucket);
    in.instance_attributes["spotvisor-bucket"] = bucket;
    CHECK(ResolveConfig(in).errors.empty());
  }
}

TEST_CASE("config file: a BOM is skipped, a directory is an error, lines are quoted escaped", "[config][issue12]") {
  auto r = ParseConfigText("\xef\xbb\xbf" "command = true\n", "f.conf");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].key == "command");
  // Only at the very start.
  CHECK((*ParseConfigText("a = 1\n\xef\xbb\xbf" "b = 2\n", "f.conf"))[1].key == "\xef\xbb\xbf" "b");

  char tmpl[] = "/tmp/spotvisor-conf-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto d = ReadConfigFile(dir);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == StatusCode::kInvalidArgument);
  CHECK(d.status().message() == "config file " + dir + ": is a directory, not a file");
  CHECK(ReadConfigFile(dir + "/missing.conf").status().code() == StatusCode::kNotFound);
  rmdir(dir.c_str());

  auto bad = ParseConfigText("ok = 1\n\xff" + std::string(500, 'x') + "\n", "f.conf");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("f.conf:2: expected `key = value`, got \"\\xffxxx") == 0);
  CHECK(bad.status().message().size() < 200);
}

}  // namespace
}  // namespace spotvisor

namespace spotvisor {
namespace {

TEST_CASE("sync-alert-after: 3 x sync-interval unless set, 0 switches it off, not shorter than one interval") {
  auto in = Base();
  in.instance_attributes["spotvisor-bucket"] = "gs://ckpt-bucket/p";
  auto r = ResolveConfig(in);
  INFO((r.errors.empty() ? std::string() : r.errors[0]));
  REQUIRE(r.config);
  CHECK(r.config->sync_alert_after == 30min);  // 3 x the default 10m
  CHECK_FALSE(r.config->sync_stall_stop);
  CHECK(r.config->checkpoint_report_interval == 1min);
  in.instance_attributes["spotvisor-sync-interval"] = "2m";
  CHECK(ResolveConfig(in).config->sync_alert_after == 6min);
  in.instance_attributes["spotvisor-sync-interval"] = "0";
  CHECK(ResolveConfig(in).config->sync_alert_after == 0ms);  // no periodic syncs: no default alert
  in.instance_attributes["spotvisor-sync-interval"] = "10m";
  in.instance_attributes["spotvisor-sync-alert-after"] = "45m";
  CHECK(ResolveConfig(in).config->sync_alert_after == 45min);
  in.instance_attributes["spotvisor-sync-alert-after"] = "10m";
  r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("sync-alert-after: 10m is not longer than sync-interval (10m)") != std::string::npos);
  in.instance_attributes["spotvisor-sync-alert-after"] = "0";
  CHECK(ResolveConfig(in).config->sync_alert_after == 0ms);
  // stop without an alert could never act.
  in.instance_attributes["spotvisor-sync-stall-action"] = "stop";
  r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("stop needs sync-alert-after") != std::string::npos);
  in.instance_attributes.erase("spotvisor-sync-alert-after");
  r = ResolveConfig(in);
  REQUIRE(r.config);
  CHECK(r.config->sync_stall_stop);
  in.instance_attributes["spotvisor-sync-stall-action"] = "kill";
  r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("sync-stall-action") != std::string::npos);
}

TEST_CASE("with a bucket the trainer is told where committed.json is") {
  auto in = Base();
  auto env = SpotvisorEnv(*ResolveConfig(in).config);
  auto has = [&](const std::string& name) {
    return std::any_of(env.begin(), env.end(), [&](auto const& kv) { return kv.first == name; });
  };
  CHECK_FALSE(has("SPOTVISOR_COMMITTED_FILE"));
  in.instance_attributes["spotvisor-bucket"] = "gs://ckpt-bucket/p";
  in.instance_attributes["spotvisor-state-dir"] = "/run/sv";
  env = SpotvisorEnv(*ResolveConfig(in).config);
  auto it = std::find_if(env.begin(), env.end(), [](auto const& kv) { return kv.first == "SPOTVISOR_COMMITTED_FILE"; });
  REQUIRE(it != env.end());
  CHECK(it->second == "/run/sv/committed.json");
}

}  // namespace
}  // namespace spotvisor

namespace spotvisor {
namespace {

TEST_CASE("preemption-notice: a stop lead longer than the notice is an error") {
  auto in = Base();
  in.instance_attributes["spotvisor-preemption-notice"] = "120s";
  in.instance_attributes["spotvisor-preemption-stop-lead"] = "60s";
  auto r = ResolveConfig(in);
  REQUIRE(r.config);
  CHECK(r.config->preemption_notice == 120s);
  in.instance_attributes["spotvisor-preemption-stop-lead"] = "150s";
  r = ResolveConfig(in);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("longer than preemption-notice (2m)") != std::string::npos);
}

}  // namespace
}  // namespace spotvisor

namespace spotvisor {
namespace {

ConfigResult WithGang(std::map<std::string, std::string> attrs) {
  auto in = Base();
  in.instance_attributes["spotvisor-gang"] = "resnet-lr3";
  in.instance_attributes["spotvisor-gang-size"] = "4";
  in.instance_attributes["spotvisor-gang-etcd"] = "http://10.0.0.5:2379, https://etcd.internal:2379/";
  for (auto const& [k, v] : attrs) in.instance_attributes["spotvisor-" + k] = v;
  return ResolveConfig(in);
}

bool AnyErrorHas(const ConfigResult& r, const std::string& text) {
  return std::any_of(r.errors.begin(), r.errors.end(), [&](auto const& e) { return e.find(text) != std::string::npos; });
}

TEST_CASE("gang keys: parsed, the gang is the default run-id, endpoints split and trimmed") {
  auto r = WithGang({});
  INFO(r.errors.size());
  REQUIRE(r.errors.empty());
  auto const& c = *r.config;
  CHECK(c.gang == "resnet-lr3");
  CHECK(c.gang_size == 4);
  CHECK(c.run_id == "resnet-lr3");
  CHECK(c.gang_etcd == std::vector<std::string>{"http://10.0.0.5:2379", "https://etcd.internal:2379"});
  CHECK(c.gang_form_timeout == 10min);
  CHECK(c.gang_lease_ttl == 10s);
  CHECK(c.gang_master_port == 29500);
  // An explicit run-id wins.
  auto in = Base();
  in.instance_attributes["spotvisor-gang"] = "g";
  in.instance_attributes["spotvisor-gang-size"] = "2";
  in.instance_attributes["spotvisor-gang-etcd"] = "http://e:2379";
  in.instance_attributes["spotvisor-run-id"] = "mine";
  CHECK(ResolveConfig(in).config->run_id == "mine");
  // No gang: none of the gang keys is checked.
  auto plain = Base();
  plain.instance_attributes["spotvisor-gang-size"] = "banana";
  CHECK(ResolveConfig(plain).errors.empty());
}

TEST_CASE("gang keys: bad values and what is not implemented yet are errors that say so") {
  CHECK(AnyErrorHas(WithGang({{"gang-size", "1"}}), "gang-size"));
  CHECK(AnyErrorHas(WithGang({{"gang-etcd", ""}}), "gang needs the etcd endpoints"));
  CHECK(AnyErrorHas(WithGang({{"gang-etcd", "10.0.0.5:2379"}}), "not an http:// or https:// URL"));
  CHECK(AnyErrorHas(WithGang({{"gang", "../x"}}), "not a gang name"));
  CHECK(WithGang({{"gang-launch", "leader"}}).config->gang_launch_leader);
  CHECK(WithGang({{"gang-launch", "leader"}, {"gang-ssh-port", "2222"}}).config->gang_ssh_port == 2222);
  CHECK(AnyErrorHas(WithGang({{"gang-ssh-port", "0"}}), "gang-ssh-port"));
  CHECK(AnyErrorHas(WithGang({{"gang-ssh-authorized-keys", "keys"}}), "not an absolute path"));
  CHECK(AnyErrorHas(WithGang({{"gang-ssh-authorized-keys", "/etc/ssh/keys"}}), "ending in /.ssh/authorized_keys"));
  CHECK(WithGang({{"gang-ssh-authorized-keys", "/srv/vm-1/.ssh/authorized_keys"}}).errors.empty());
  CHECK(AnyErrorHas(WithGang({{"gang-launch", "mpi"}}), "gang-launch"));
  CHECK(AnyErrorHas(WithGang({{"gang-on-loss", "later"}}), "gang-on-loss"));
  CHECK(AnyErrorHas(WithGang({{"gang-reform-timeout", "0"}}), "gang-reform-timeout"));
  CHECK(WithGang({{"gang-on-loss", "wait"}, {"gang-reform-timeout", "5m"}}).config->gang_reform_timeout == 5min);
  CHECK(WithGang({{"gang-checkpoint", "all"}}).config->gang_checkpoint_all);
  CHECK_FALSE(WithGang({}).config->gang_checkpoint_all);
  CHECK(AnyErrorHas(WithGang({{"gang-checkpoint", "every"}}), "gang-checkpoint"));
  CHECK(AnyErrorHas(WithGang({{"gang-lease-ttl", "1s"}}), "gang-lease-ttl"));
  CHECK(AnyErrorHas(WithGang({{"gang-lease-ttl", "2500ms"}}), "whole seconds"));
  CHECK(AnyErrorHas(WithGang({{"gang-etcd-cert", "/c.pem"}}), "go together"));
  CHECK(AnyErrorHas(WithGang({{"gang-etcd-user", "u"}}), "go together"));
  CHECK(AnyErrorHas(WithGang({{"gang-address", "10.0.0.1 10.0.0.2"}}), "not an address"));
  CHECK(AnyErrorHas(WithGang({{"restart", "on-failure"}}), "needs gang-on-loss = wait"));
  CHECK(WithGang({{"restart", "on-failure"}, {"gang-on-loss", "wait"}}).errors.empty());
  CHECK(AnyErrorHas(WithGang({{"gang-master-port", "70000"}}), "gang-master-port"));
}

TEST_CASE("gang-etcd-password is a secret: never shown, never in an error") {
  auto* k = FindKey("gang-etcd-password");
  REQUIRE(k);
  CHECK(k->secret);
  auto r = WithGang({{"gang-etcd-user", "trainer"}, {"gang-etcd-password", "hunter2"}, {"gang-size", "x"}});
  CHECK(r.config == std::nullopt);
  for (auto const& e : r.errors) CHECK(e.find("hunter2") == std::string::npos);
}

}  // namespace
}  // namespace spotvisor
