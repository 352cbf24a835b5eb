#!/usr/bin/env bash
# The Packer templates are checked by Debian's packer (1.6.6; HashiCorp's own
# releases are not reachable from the machines this runs on): syntax, the
# googlecompute and amazon-ebs builders' own option checks, and formatting. Building an
# image needs GCP and is not done here (docs/quickstart.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v packer >/dev/null; then
  echo "packer is not installed (apt-get install packer): template not validated" >&2
  exit 77
fi
deb=$(mktemp --suffix=.deb)
trap 'rm -f "$deb"' EXIT
packer validate -var project_id=example-project -var "deb=$deb" packer/spotvisor.pkr.hcl
# The AWS template (amazon-ebs, built into 1.6.6); validating it calls no AWS API.
packer validate -var "deb=$deb" packer/aws/spotvisor.pkr.hcl
packer fmt -check packer/
packer fmt -check packer/aws/
bash -n packer/provision.sh
echo "packer: GCE and AWS templates valid, formatting clean ($(packer version | head -1))"
