// The ssh trust `gang-launch = leader` needs for one generation (issue #16):
// the leader (rank 0) runs `mpiexec --hostfile`, which reaches the other
// members over ssh as the trainer user. Per generation the leader makes a
// fresh ed25519 key pair (the private key never leaves it), publishes the
// public key, and every other member puts it into the trainer user's
// authorized_keys restricted to the leader's address
// (`from="IP",restrict KEY TAG`), then takes it out again when the
// generation ends. Nothing else of the machine is opened.
//
// spotvisor runs as root and edits files in a directory the trainer user
// owns, so every path below the user's home is opened without following
// symlinks and through directory file descriptors: a trainer pointing
// ~/.ssh or authorized_keys (or the key file) at a file of root's gets an
// error, never root writing, reading back or chown'ing that file.
#pragma once

#include <string>
#include <string_view>

#include "common/cancel.h"
#include "common/status.h"
#include "process/children.h"
#include "process/user.h"

namespace spotvisor {

struct SshKeyPair {
  std::string private_key_path;  // DIR/NAME, owned by the key's user, 0600
  std::string public_key;        // one line, no newline: "ssh-ed25519 AAAA... COMMENT"
};

// A fresh ed25519 key pair DIR/NAME and DIR/NAME.pub, made by
// `ssh-keygen -t ed25519 -N "" -q -C COMMENT -f DIR/NAME` run as `owner`
// (so ssh-keygen only ever writes with the trainer user's own rights) and
// through `children` (the supervisor reaps with waitpid(-1)). DIR is created
// 0700 and given to owner when missing (its parent must exist); an existing
// DIR must be a real directory owned by owner and is made 0700. An existing
// key of the same name is replaced. ssh-keygen is killed when ctx's deadline
// passes or ctx is cancelled (it gets at most 60 s without a deadline). NAME
// is [A-Za-z0-9._-] (not "." or ".."); COMMENT follows the public key's
// comment rules (ParseEd25519PublicKey). Blocks: call from a worker thread.
// `ssh_keygen` is the program (searched in the usual system PATH); tests
// substitute a stand-in.
StatusOr<SshKeyPair> GenerateKeyPair(const std::string& dir, const std::string& name, const std::string& comment,
                                     const UserInfo& owner, ChildRegistry& children, const CallContext& ctx,
                                     const std::string& ssh_keygen = "ssh-keygen");

// A public key line from outside (etcd): exactly "ssh-ed25519 BASE64" or
// "ssh-ed25519 BASE64 COMMENT", one space between fields, BASE64 strict
// (canonical, padded) and decoding to the ssh wire format of an ed25519 key
// (string "ssh-ed25519", string of 32 bytes, nothing more); COMMENT 1-256
// printable ASCII characters (spaces allowed) without ' " \ or `; the whole
// line at most 1024 bytes. Returns the line rebuilt from its checked fields,
// or an error saying what is wrong that never contains the raw bytes.
StatusOr<std::string> ParseEd25519PublicKey(std::string_view line);

// A tag marking spotvisor's own authorized_keys lines: 1-200 of
// [A-Za-z0-9._:-], e.g. "spotvisor-gang:NAME:GENERATION".
Status CheckKeyTag(std::string_view tag);

// Puts `from="IP",restrict ssh-ed25519 BASE64 TAG` into HOME/.ssh/authorized_keys
// of `user` (the public key's own comment is dropped: TAG names the line),
// in place of the first line whose last field is TAG (further ones are
// removed), or appended. IP is an IPv4 or IPv6 literal (inet_pton; written
// as inet_ntop prints it, an IPv4-mapped IPv6 address as IPv4, since that is
// what sshd matches `from=` against). Creates ~/.ssh (0700) and the file
// (0600) owned by the user when missing; HOME itself must exist. Every
// other line is kept byte for byte (a last line without a newline gets one
// before the appended line). The file is rewritten atomically (a temp file
// in ~/.ssh, fsync, rename, fsync of ~/.ssh) keeping its owner, group and
// permissions (less any group/other write bit). Refused: ~/.ssh or
// authorized_keys being a symlink or not a directory/regular file,
// authorized_keys with more than one hard link or larger than 1 MiB, either
// owned by somebody but the user or root.
Status AuthorizeKey(const UserInfo& user, const std::string& from_ip, std::string_view public_key_line,
                    const std::string& tag);

// Removes every line whose last field is TAG or, with prefix, starts with
// TAG (after a crash, "spotvisor-gang:NAME:" revokes every generation of a
// gang: end the prefix with ':' so gang "a" does not match gang "ab").
// Comment lines are never touched. Returns how many lines were removed;
// a missing ~/.ssh or authorized_keys is 0. The same atomic rewrite and
// refusals as AuthorizeKey; nothing is written when nothing matches.
StatusOr<int> RevokeKeys(const UserInfo& user, const std::string& tag, bool prefix);

}  // namespace spotvisor
