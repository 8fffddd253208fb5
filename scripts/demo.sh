#!/usr/bin/env bash
# The main job on a built-in sample: python-casacore writes a real table stored
# as a MultiFile, ctdsfs describes its table.mf, mounts it, lists and reads it,
# and unmounts again; then Debian's casacore 3.5 reads the same table through
# a mount of its directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"

work=$(mktemp -d /tmp/ctdsfs-demo.XXXXXX)
cleanup() {
    for m in "$work/mnt" "$work/view"; do
        if mountpoint -q "$m" 2>/dev/null; then
            fusermount3 -u "$m" || fusermount3 -uz "$m"
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT

echo
echo "== python-casacore writes demo.tab with storage option MultiFile"
mkdir -p "$work/home" "$work/mnt"
printf 'table.storage.option: multifile\ntable.storage.blocksize: 4096\n' > "$work/home/.casarc"
(cd "$work" && HOME="$work/home" python3 "$here/make_sample_table.py" demo.tab)
ls -l "$work/demo.tab"

echo
echo "== ctdsfs info demo.tab/table.mf"
ctdsfs info "$work/demo.tab/table.mf"

echo
echo "== mount.ctdsfs demo.tab/table.mf mnt"
mount.ctdsfs "$work/demo.tab/table.mf" "$work/mnt"
ls -l "$work/mnt"
echo
echo "== the first 64 bytes of table.f0, read through the mount"
od -A d -t x1 -N 64 "$work/mnt/table.f0"
md5sum "$work/mnt"/*

echo
echo "== fusermount3 -u mnt"
fusermount3 -u "$work/mnt"

echo
echo "== casacore 3.5 cannot read demo.tab (MultiFile v2) ..."
legacy=$(showtableinfo in="$work/demo.tab" 2>&1 || true)
tail -n 1 <<< "$legacy"
echo "== ... but reads it through a mount of its directory (the legacy table view)"
mkdir -p "$work/view"
mount.ctdsfs "$work" "$work/view"
ls "$work/view/demo.tab"
info=$(showtableinfo in="$work/view/demo.tab")
sed -n 1,12p <<< "$info"
fusermount3 -u "$work/view"
echo "demo: done"
