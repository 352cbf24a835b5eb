# Bakes an AMI for training on EC2 Spot instances with spotvisor: an AWS Deep
# Learning AMI (Ubuntu, NVIDIA driver, CUDA, PyTorch) plus the spotvisor .deb,
# whose service starts at every boot of an instance made from the AMI.
# docs/quickstart-aws.md walks through using it.
#
#   packer init packer/aws/                   # fetches the amazon plugin (plugins.pkr.hcl)
#   packer build -var deb=path/to/spotvisor_VERSION-1_amd64.deb packer/aws/
#
# Credentials and region come from the usual AWS places (AWS_PROFILE,
# AWS_REGION, ...). IMDSv2-only (http_tokens = required) is set on the
# instances that train (docs/quickstart-aws.md), not here: packer 1.6.6's
# amazon-ebs has no metadata_options block; spotvisor uses IMDSv2 either way. Checked here only with Debian 12's packer 1.6.6, whose
# built-in amazon-ebs builder has every option used below: `packer validate`
# and `packer fmt -check` pass (tests/packer/validate.sh). Nothing has been
# built against real AWS.
#
# The bake instance must not run a trainer or power itself off: provision.sh
# keeps the service from starting during the install and stops it if it runs
# anyway, and the bake instance's user data says on-exit = none (instances
# made from the AMI do not inherit user data).

variable "deb" {
  type        = string
  description = "Path on this machine of the spotvisor .deb to install (built by scripts/package.sh)."
}

variable "region" {
  type    = string
  default = "us-east-1"
}

# Deep Learning AMI names change with each release; this filter takes the
# newest Ubuntu 22.04 "Deep Learning OSS Nvidia Driver AMI GPU PyTorch" that
# Amazon owns. Check what exists first:
#   aws ec2 describe-images --owners amazon --filters \
#     'Name=name,Values=Deep Learning OSS Nvidia Driver AMI GPU PyTorch*Ubuntu 22.04*' \
#     --query 'sort_by(Images,&CreationDate)[-1].Name'
variable "source_ami_name" {
  type    = string
  default = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *"
}

# The bake needs no GPU: the driver is already in the source AMI.
variable "instance_type" {
  type    = string
  default = "m5.xlarge"
}

variable "volume_size_gb" {
  type    = number
  default = 100
}

variable "install_rclone" {
  type    = bool
  default = false
}

variable "install_mpi" {
  type    = bool
  default = false
}

locals {
  ami_name = "spotvisor-${formatdate("YYYYMMDD-hhmmss", timestamp())}"
}

source "amazon-ebs" "spotvisor" {
  region        = var.region
  instance_type = var.instance_type
  ssh_username  = "ubuntu"
  source_ami_filter {
    filters = {
      name                = var.source_ami_name
      architecture        = "x86_64"
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    owners      = ["amazon"]
    most_recent = true
  }
  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = var.volume_size_gb
    volume_type           = "gp3"
    throughput            = 125
    iops                  = 3000
    delete_on_termination = true
  }
  # Guard for the bake instance only (see the top of this file).
  user_data = "[spotvisor]\non-exit = none\n"
  run_tags = {
    spotvisor-bake = "true"
  }
  ami_name        = local.ami_name
  ami_description = "spotvisor on ${var.source_ami_name}"
  tags = {
    spotvisor = "baked"
  }
}

build {
  sources = ["source.amazon-ebs.spotvisor"]

  provisioner "file" {
    source      = var.deb
    destination = "/tmp/spotvisor.deb"
  }

  provisioner "shell" {
    script = "${path.root}/../provision.sh"
    environment_vars = [
      "SPOTVISOR_DEB=/tmp/spotvisor.deb",
      "INSTALL_RCLONE=${var.install_rclone}",
      "INSTALL_MPI=${var.install_mpi}",
      "INSTALL_GCSFUSE=false",
    ]
    execute_command = "chmod +x {{ .Path }}; sudo env {{ .Vars }} {{ .Path }}"
  }
}
