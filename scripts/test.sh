#!/usr/bin/env bash
# Installs everything (see setup.sh), then runs the whole test suite:
# codecs, containers, VFS, real FUSE mounts and interop with the real tools.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/setup.sh"
cd "$here/.."
python3 -m ruff check --quiet src tests scripts  # a stray import or unused name fails here
python3 -m mypy  # the typed interfaces ([tool.mypy] in pyproject.toml)
# two workers, each test file on one of them (its module fixtures built once): most tests
# wait on mounts, servers and child processes, so two files at a time fit on two cores
exec python3 -m pytest -ra -q -n 2 --dist loadfile tests "$@"
