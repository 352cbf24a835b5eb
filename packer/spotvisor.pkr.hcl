# Bakes a GCE image for training on Spot VMs with spotvisor: a Deep Learning
# VM image (NVIDIA driver, CUDA, Python) plus gcsfuse from Google's apt
# repository and the spotvisor .deb, whose service starts at every boot of a
# VM made from the image. docs/quickstart.md walks through using it.
#
#   packer init packer/                       # fetches the googlecompute plugin (plugins.pkr.hcl)
#   packer build -var project_id=MY_PROJECT \
#     -var deb=path/to/spotvisor_VERSION-1_amd64.deb packer/
#
# Checked here only with Debian 12's packer 1.6.6 (HashiCorp's releases and
# its plugin registry cannot be reached from where this was written): with
# it, `packer validate` and `packer fmt -check` pass on this file, whose
# builder options exist in both 1.6.6's built-in googlecompute builder and
# the current plugin (checked against its v1.2.8 config.hcl2spec.go). 1.6.6 predates
# `required_plugins`, so plugins.pkr.hcl, which current Packer needs, was
# only checked with `packer fmt`. Nothing has been built against real GCP.
#
# What keeps the bake VM's state out of the image: the service is enabled
# but must not run on the bake VM. That VM has no spotvisor-command, so a
# running daemon would stop with a configuration error and power the VM off
# mid-bake (on-exit runs after configuration errors); with a spotvisor-command
# in the project's metadata it would even start a trainer. The package says its
# postinst enables the service without starting it; provision.sh does not rely
# on that: it denies service starts during the install (policy-rc.d), stops the
# service if it runs anyway, checks it is enabled, and clears checkpoints, the
# journal and the machine-id. The bake VM also gets spotvisor-on-exit=none
# (below), so that a daemon started some other way cannot power it off.
# Instance metadata is not part of the image: VMs made from it do not
# inherit that attribute.

variable "project_id" {
  type        = string
  description = "Project the bake VM runs in and the image is stored in."
}

variable "zone" {
  type    = string
  default = "us-central1-a"
}

variable "deb" {
  type        = string
  description = "Path on this machine of the spotvisor .deb to install (built by scripts/package.sh)."
}

# Deep Learning VM families change as CUDA and driver versions move on (the
# Debian-based families were deprecated; current ones are Ubuntu 22.04/24.04
# with the NVIDIA driver preinstalled). This default was taken from Google's
# "Choose an image" page; check that it still exists before building:
#   gcloud compute images list --project deeplearning-platform-release \
#     --no-standard-images --format='value(family)' | sort -u
# PyTorch comes preinstalled in the pytorch-* families (for example
# pytorch-2-9-cu129-ubuntu-2204-nvidia-580).
variable "source_image_family" {
  type    = string
  default = "common-cu129-ubuntu-2204-nvidia-580"
}

variable "source_image_project" {
  type    = string
  default = "deeplearning-platform-release"
}

variable "image_family" {
  type        = string
  default     = ""
  description = "Family of the new image; empty means spotvisor-SOURCE_IMAGE_FAMILY."
}

# The bake needs no GPU: the driver is already in the source image.
variable "machine_type" {
  type    = string
  default = "e2-standard-4"
}

# At least the source image's size (see its diskSizeGb:
#   gcloud compute images describe-from-family FAMILY --project deeplearning-platform-release
# ). It becomes the smallest boot disk a VM made from the image can have.
variable "disk_size_gb" {
  type    = number
  default = 100
}

variable "network" {
  type    = string
  default = "default"
}

variable "subnetwork" {
  type    = string
  default = ""
}

variable "use_os_login" {
  type        = bool
  default     = false
  description = "Set when the organisation enforces OS Login."
}

variable "install_rclone" {
  type        = bool
  default     = false
  description = "Also install rclone, for mount-driver = rclone."
}

variable "install_mpi" {
  type        = bool
  default     = false
  description = "Also install sshd, ssh and Open MPI, for gangs with gang-launch = leader."
}

locals {
  image_family = var.image_family != "" ? var.image_family : "spotvisor-${var.source_image_family}"
  # Image names are at most 63 characters, so the family is not repeated here.
  image_name = "spotvisor-${formatdate("YYYYMMDD-hhmmss", timestamp())}"
}

source "googlecompute" "spotvisor" {
  project_id              = var.project_id
  zone                    = var.zone
  source_image_family     = var.source_image_family
  source_image_project_id = [var.source_image_project]
  machine_type            = var.machine_type
  disk_size               = var.disk_size_gb
  disk_type               = "pd-balanced"
  network                 = var.network
  subnetwork              = var.subnetwork
  ssh_username            = "packer"
  use_os_login            = var.use_os_login

  # Guard for the bake VM only (see the top of this file).
  metadata = {
    spotvisor-on-exit = "none"
  }
  labels = {
    spotvisor-bake = "true"
  }

  image_name        = local.image_name
  image_family      = local.image_family
  image_description = "spotvisor on ${var.source_image_project}/${var.source_image_family}"
  image_labels = {
    spotvisor     = "baked"
    source-family = var.source_image_family
  }
}

build {
  sources = ["source.googlecompute.spotvisor"]

  provisioner "file" {
    source      = var.deb
    destination = "/tmp/spotvisor.deb"
  }

  provisioner "shell" {
    script = "${path.root}/provision.sh"
    environment_vars = [
      "SPOTVISOR_DEB=/tmp/spotvisor.deb",
      "INSTALL_RCLONE=${var.install_rclone}",
      "INSTALL_MPI=${var.install_mpi}",
    ]
    execute_command = "chmod +x {{ .Path }}; sudo env {{ .Vars }} {{ .Path }}"
  }
}
