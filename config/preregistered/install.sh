#!/usr/bin/env bash
# Installs nri-gpu as a pre-registered NRI plugin: containerd starts it
# itself, and synchronizes it before CRI serves, so no container is created
# before nri-gpu is there. Needs NRI on with plugin_path /opt/nri/plugins
# and plugin_config_path /etc/nri/conf.d (config/containerd-1.7.toml).
#
#   config/preregistered/install.sh _output/bin/nri-gpu && systemctl restart containerd
set -euo pipefail
bin=${1:?usage: install.sh PATH-TO-nri-gpu}
here=$(cd "$(dirname "$0")" && pwd)
"$bin" validate "$here/10-nri-gpu.conf"
install -D -m 0755 "$bin" /opt/nri/plugins/10-nri-gpu
install -D -m 0644 "$here/10-nri-gpu.conf" /etc/nri/conf.d/10-nri-gpu.conf
echo "installed; restart containerd to start nri-gpu"
