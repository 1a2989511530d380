#!/usr/bin/env bash
# A Debian 12 root with systemd for tests/integration/test_real_systemd.py, made once by debootstrap into a cache
# outside the repository (GPUWARDEN_NSPAWN, default ~/.cache/gpuwarden-nspawn; 1.5 to 4 minutes and 600 MB).
# A second run checks the stamp and returns at once. The test boots a throw-away copy of it, never the root
# itself. It holds what the README's `make install` needs (make, gcc, pkg-config, libsystemd-dev, python3-dev,
# python3-venv) so that the install inside never reaches for apt, plus curl for the checks.
set -euo pipefail
CACHE=${GPUWARDEN_NSPAWN:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuwarden-nspawn}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,python3-dev,make,gcc,libc6-dev,pkg-config,libsystemd-dev,curl,ca-certificates,procps,iproute2
want="bookworm $PACKAGES"
root=$CACHE/bookworm
[ -f "$root/.installed" ] && [ "$(cat "$root/.installed")" = "$want" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then  # debootstrap and nspawn need root; so does the test, which skips without it
  echo "nspawn: not root, no container root made (tests/integration/test_real_systemd.py needs root)"; exit 0
fi
bash "$(dirname "$0")/../../.ci/apt-needs" debootstrap:debootstrap systemd-nspawn:systemd-container
echo "nspawn: debootstrap bookworm into $root (1.5 to 4 minutes)"
mkdir -p "$CACHE"
# a failed debootstrap can leave /proc, /sys or a bind of the host's /dev mounted inside: unmount, and never
# let rm cross into another file system
clean() { for d in "$@"; do
  findmnt -rn -o TARGET | { grep -F "$d/" || true; } | sort -r | xargs -r -d '\n' umount -l
  rm -rf --one-file-system "$d"
done; }
clean "$root" "$root.new"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root.new" "$MIRROR" >/dev/null
# no getty or networkd in a test container: a quicker boot, and nothing that touches the host's network
rm -f "$root.new"/etc/systemd/system/getty.target.wants/* "$root.new"/etc/systemd/system/multi-user.target.wants/systemd-networkd.service
echo gpuwarden-test > "$root.new/etc/hostname"
mv "$root.new" "$root"
echo "$want" > "$root/.installed"
