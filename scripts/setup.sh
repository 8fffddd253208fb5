#!/usr/bin/env bash
# Installs everything ctdsfs and its tests need on Debian 12 with Python >= 3.11:
# FUSE 3 and the legacy casacore 3.5 (tools and Debian's Python client, for
# /usr/bin/python3; casacore-dev and g++: a test compiles a writer of TiledDataStMan
# tables, which only casacore's C++ library can make) and podman, runc and debootstrap (the container-image test
# builds docker/Dockerfile on a debootstrapped base) and util-linux (setpriv, unshare:
# tests act as another user and hide /dev/fuse in a namespace), nginx (an HTTP source),
# squashfuse, squashfs-tools and fio (peers and load for the benchmark) from apt, the project with
# its test extras from PyPI (then numba's kernels compiled once), the mount(8) helper link
# for 'mount -t fuse.ctdsfs', and the
# manual pages ctdsfs(1) and mount.ctdsfs(8) in /usr/local/share/man.
# Safe to run again; skips apt when the packages are already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(fuse3 libfuse3-dev pkg-config casacore-tools python3-casacore casacore-dev g++
              podman runc debootstrap util-linux nginx squashfuse squashfs-tools fio)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]} (apt)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
echo "setup: installing ctdsfs and its test extras (pip)"
"$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[test]'
# pip byte-compiles what it installs, but not an editable checkout: where
# PYTHONDONTWRITEBYTECODE is set, each mount would compile ctdsfs anew (about
# 0.04 s and 2 MB of the daemon). Stale files are recompiled, never trusted.
"$PYTHON" -m compileall -q src/ctdsfs >/dev/null
# numba compiles Dysco's and Sisco's decoding kernels at their first use after an
# install (seconds): here, once, into its cache, not in the first mount or test.
"$PYTHON" scripts/warm_kernels.py

# mount(8) runs /sbin/mount.fuse.ctdsfs for filesystems of type fuse.ctdsfs; a
# wrapper (not a link) so that shims which dispatch on their own name still work.
helper="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/mount.ctdsfs"
wrapper=$(printf '#!/bin/sh\nexec "%s" "$@"\n' "$helper")
if [ -d /sbin ] && [ "$(cat /sbin/mount.fuse.ctdsfs 2>/dev/null)" != "$wrapper" ]; then
    printf '%s\n' "$wrapper" | $SUDO tee /sbin/mount.fuse.ctdsfs >/dev/null
    $SUDO chmod 755 /sbin/mount.fuse.ctdsfs
fi
# The manual pages, so that 'man mount.ctdsfs' and 'man ctdsfs' work (man-db if man is missing,
# as in Debian's slim images).
if ! command -v man >/dev/null; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq man-db >/dev/null
fi
for page in man/ctdsfs.1 man/mount.ctdsfs.8; do
    section=${page##*.}
    $SUDO install -D -m 644 "$page" "/usr/local/share/man/man$section/$(basename "$page")"
done
echo "setup: done ($("$PYTHON" -c 'import ctdsfs; print("ctdsfs", ctdsfs.__version__)'))"
