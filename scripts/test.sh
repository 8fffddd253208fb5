#!/usr/bin/env bash
# Installs everything (see setup.sh), then runs the whole test suite:
# codecs, containers, VFS, real FUSE mounts and interop with the real tools.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
cd "$here/.."
python3 -m ruff check --quiet src tests scripts  # a stray import or unused name fails here
exec python3 -m pytest -ra -q tests "$@"
