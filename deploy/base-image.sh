#!/usr/bin/env bash
# A stand-in for python:3.11-slim, made from Debian's packages: for a site (or a test) that
# cannot pull from Docker Hub. Debian bookworm's Python is 3.11, as the image expects.
#
#   deploy/base-image.sh [NAME] [MIRROR]
#
# NAME defaults to localhost/tidal-python:3.11; MIRROR to the mirror apt already uses.
# Needs root, debootstrap, and podman (or docker). Then build tidal on it:
#   podman build --build-arg PYTHON_IMAGE=localhost/tidal-python:3.11 -t tidal .
set -euo pipefail
name=${1:-localhost/tidal-python:3.11}
mirror=${2:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
engine=$(command -v podman || command -v docker || true)
[ -n "$engine" ] || { echo "base-image.sh: needs podman or docker" >&2; exit 2; }
engine=("$engine")
if [ "$(basename "${engine[0]}")" = podman ]; then  # crun cannot run on cgroups v1 or hybrid
  engine+=(--runtime "$("$(dirname "$0")/oci-runtime.sh")")
fi
command -v debootstrap >/dev/null || { echo "base-image.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "base-image.sh: debootstrap needs root" >&2; exit 2; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$mirror" >/dev/null
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"
rm -f "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED  # pip installs into the image, as in python:slim
# the host's CA bundle: pip in a build step goes through the same TLS path as the host
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -cf - . | "${engine[@]}" import --quiet \
  --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$name" >/dev/null
echo "$name"
