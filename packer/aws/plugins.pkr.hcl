# Current Packer (1.10 and later) no longer bundles the amazon builder:
# `packer init packer/aws/` installs it from this block. Kept apart from
# spotvisor.pkr.hcl because Debian 12's packer 1.6.6 predates
# required_plugins and cannot parse it.
packer {
  required_version = ">= 1.7.0"
  required_plugins {
    amazon = {
      version = ">= 1.2.0"
      source  = "github.com/hashicorp/amazon"
    }
  }
}
