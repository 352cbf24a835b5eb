// Gang training (Supervisor, continued): forming, the generation's ranks and
// environment, the ssh trust of gang-launch = leader.
#include "supervisor/supervisor.h"

#include <fmt/format.h>

#include "state/status_file.h"

namespace spotvisor {

namespace asio = boost::asio;

void Supervisor::StartForming() {
  auto gang = options_.gang;
  if (!gang) return;
  // Forming again (gang-on-loss = wait): nothing of the last generation holds.
  DropSshTrust();
  gang_generation_.reset();
  gang_rank_ = -1;
  gang_follower_ = false;
  GangSession::Callbacks cb;
  cb.formed = [this](const Generation& g, int rank) { asio::post(io_, [this, g, rank] { OnGangFormed(g, rank); }); };
  cb.failed = [this](const Status& s) {
    asio::post(io_, [this, s] { Dispatch(GangFormFailed{s.message()}); });
  };
  cb.ended = [this](std::int64_t n, const GenerationEnd& end) {
    asio::post(io_, [this, n, end] {
      DropSshTrust();
      Dispatch(GangEnded{n, end.reason, end.reason == kGangCompleted, end.failed});
    });
  };
  gang->Start(std::move(cb));
}

void Supervisor::OnGangFormed(const Generation& g, int rank) {
  if (machine_.state() != State::kForming) return;  // stopped meanwhile
  gang_generation_ = g;
  gang_rank_ = rank;
  // gang-checkpoint = leader: rank 0's directory is the gang's checkpoint;
  // all: every rank syncs its own, under rank-K/.
  if (options_.gang_rank_store) options_.gang_rank_store->SetRank(rank);
  gang_follower_ = rank != 0 && !options_.gang_rank_store;
  if (options_.sync && gang_follower_) {
    logger_.Info("sync.follower",
                 fmt::format("this gang member (rank {}) restores checkpoints but does not sync them: rank 0 ({}) syncs "
                             "the gang's (gang-checkpoint = leader)",
                             rank, g.members.empty() ? "" : g.members[0].instance),
                 {{"rank", rank}});
  }
  // The OpenMPI hostfile (one slot per node: one trainer per VM), replaced atomically.
  std::string hostfile;
  for (auto const& m : g.members) hostfile += m.ip + " slots=1\n";
  auto path = options_.config.state_dir + "/gang-hostfile";
  if (auto s = WriteFileAtomically(path, hostfile, /*durable=*/false); !s.ok()) {  // rewritten every generation: no fsync on the loop
    logger_.Warn("gang.hostfile_failed", fmt::format("cannot write {}: {}", path, s.message()));
  }
  if (!LeaderMode()) {
    Dispatch(GangFormed{g.number, rank, !gang_follower_});
    return;
  }
  // gang-launch = leader: the generation's ssh trust first; the trainers
  // (rank 0's mpiexec, the others' stand-ins) start once every member
  // trusts rank 0's key. Bounded by the forming state's deadline.
  auto gang = options_.gang;
  auto leader_ip = g.members.empty() ? std::string() : g.members[0].ip;
  auto user = ssh_user_;
  auto tag = SshTag(g.number);
  auto dir = SshKeyDir();
  auto children = options_.children;
  CallContext ctx;
  ctx.clock = &clock_;
  ctx.cancel = NewWork();
  pool_.Post([this, gang, g, rank, user, tag, dir, children, ctx, leader_ip] {
    auto make_key = [&]() -> StatusOr<std::string> {
      if (!user.ok()) return user.status();
      auto kp = GenerateKeyPair(dir, "id_ed25519", tag, *user, *children, ctx);
      if (!kp.ok()) return kp.status();
      return kp->public_key;
    };
    auto authorize = [&](const std::string& line) -> Status {
      if (!user.ok()) return user.status();
      auto checked = ParseEd25519PublicKey(line);
      if (!checked.ok()) return Status(checked.status().code(), "rank 0's ssh key from etcd: " + checked.status().message());
      return AuthorizeKey(*user, leader_ip, *checked, tag);
    };
    auto s = gang->SetUpSshTrust(g, rank, make_key, authorize, ctx);
    asio::post(io_, [this, s, g, rank, leader_ip] {
      if (machine_.state() != State::kForming || !gang_generation_ || gang_generation_->number != g.number) return;
      if (!s.ok()) {
        logger_.Error("gang.ssh_failed",
                      fmt::format("gang-launch = leader: the ssh trust of generation {} could not be set up: {}", g.number,
                                  s.message()),
                      {{"generation", g.number}, {"rank", rank}, {"error", s.message()}});
        Dispatch(GangFormFailed{"gang-launch = leader: the ssh trust could not be set up: " + s.message()});
        return;
      }
      logger_.Info("gang.ssh_ready",
                   rank == 0 ? fmt::format("every member trusts this generation's ssh key (generation {}): mpiexec may "
                                           "reach them on port {}",
                                           g.number, options_.config.gang_ssh_port)
                             : fmt::format("rank 0 ({}) may ssh to this member for generation {} (from= its address only)",
                                           leader_ip, g.number),
                   {{"generation", g.number}, {"rank", rank}, {"leader", leader_ip}});
      Dispatch(GangFormed{g.number, rank, !gang_follower_});
    });
  });
}

bool Supervisor::LeaderMode() const { return options_.gang && options_.config.gang_launch_leader; }

std::string Supervisor::SshTag(std::int64_t generation) const {
  return fmt::format("spotvisor-gang:{}:{}", options_.config.gang, generation);
}

std::string Supervisor::SshKeyDir() const { return options_.config.state_dir + "/gang-ssh"; }

std::string Supervisor::SshKeyPath() const { return SshKeyDir() + "/id_ed25519"; }

// The generation is over (or this member leaves): its key is no longer
// trusted here, and rank 0's private key goes. Local files only: on the loop.
void Supervisor::DropSshTrust() {
  if (!LeaderMode()) return;
  if (ssh_user_.ok()) {
    auto n = RevokeKeys(*ssh_user_, fmt::format("spotvisor-gang:{}:", options_.config.gang), /*prefix=*/true);
    if (!n.ok()) {
      logger_.Warn("gang.ssh_revoke_failed", "could not remove the gang's ssh key from authorized_keys: " + n.status().message(),
                   {{"error", n.status().message()}});
    } else if (*n > 0) {
      logger_.Info("gang.ssh_revoked", fmt::format("removed the gang's ssh key from authorized_keys ({} line(s))", *n),
                   {{"lines", *n}});
    }
  }
  for (auto const& f : {SshKeyPath(), SshKeyPath() + ".pub"}) unlink(f.c_str());
}

std::vector<std::string> Supervisor::GangEnv() const {
  if (!options_.gang || !gang_generation_) return {};
  auto const& g = *gang_generation_;
  std::string hosts;
  for (auto const& m : g.members) hosts += (hosts.empty() ? "" : ",") + m.ip;
  auto n = std::to_string(g.members.size());
  auto r = std::to_string(gang_rank_);
  std::string master = g.members.empty() ? "" : g.members[0].ip;
  return {
      "SPOTVISOR_GANG=" + options_.config.gang,
      "SPOTVISOR_GANG_RANK=" + r,
      "SPOTVISOR_GANG_SIZE=" + n,
      "SPOTVISOR_GANG_GENERATION=" + std::to_string(g.number),
      // Unlike the number, never the same for two generations, also across
      // a new etcd: a name for what this generation saves (issue #28).
      "SPOTVISOR_GANG_SET_ID=" + g.set_id,
      "SPOTVISOR_GANG_HOSTS=" + hosts,
      "SPOTVISOR_GANG_HOSTFILE=" + options_.config.state_dir + "/gang-hostfile",
      // torch.distributed's env:// initialisation, one process per node.
      "MASTER_ADDR=" + master,
      "MASTER_PORT=" + std::to_string(options_.config.gang_master_port),
      "RANK=" + r,
      "WORLD_SIZE=" + n,
      "LOCAL_RANK=0",
      // torchrun's --nnodes / --node_rank.
      "NNODES=" + n,
      "NODE_RANK=" + r,
  };
}

}  // namespace spotvisor
