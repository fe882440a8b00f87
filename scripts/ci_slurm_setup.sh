#!/usr/bin/env bash
# Installs what tests/workflow/test_slurm_cluster.py needs for its one-node Slurm cluster on localhost:
# Debian's Slurm daemons, accounting (slurmdbd + a local MariaDB), munge, and the Snakemake Slurm
# executor plugin into the active Python environment. Run as root (CI containers are).
#   bash scripts/ci_slurm_setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  # Containers have no init system: keep the packages' maintainer scripts from starting daemons
  # (the test starts and stops its own).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python -m pip install -q -e '.[slurm]'
