#!/usr/bin/env bash
# The OCI runtime podman should use on this host, printed once for every podman call to pass
# as `podman --runtime NAME`. Debian's podman defaults to crun, which cannot start a
# container (not even a build's RUN step) where cgroups are v1 or hybrid: "cgroups in hybrid
# mode not supported". runc can. So: on a unified cgroup v2 host, podman's own default; on
# any other, runc (make test installs it beside podman).
set -euo pipefail
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2 mounted at the root: unified
  podman info --format '{{.Host.OCIRuntime.Name}}'
  exit 0
fi
if command -v runc >/dev/null || [ -x /usr/sbin/runc ]; then
  echo runc
  exit 0
fi
echo "oci-runtime.sh: this host's cgroups are v1 or hybrid, where crun cannot run containers; install runc (apt-get install runc)" >&2
exit 2
