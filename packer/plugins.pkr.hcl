# Current Packer (1.10 and later) no longer bundles the googlecompute
# builder: `packer init packer/` installs it from this block. Kept apart from
# spotvisor.pkr.hcl because the only Packer installable where this was
# written (Debian 12's 1.6.6) predates required_plugins and cannot parse it.
packer {
  required_version = ">= 1.7.0"
  required_plugins {
    googlecompute = {
      version = ">= 1.1.0"
      source  = "github.com/hashicorp/googlecompute"
    }
  }
}
