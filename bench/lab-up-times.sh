#!/usr/bin/env bash
# Times `invoke lab.up` from a cold cache (everything under /var/lib/pdfleet-lab purged, so the
# image is debootstrapped and the mirrors downloaded again), from a warm one (after lab.down), and
# on a running lab. Needs root and access to the Debian archive and PyPI. Leaves the lab down.
set -euo pipefail
cd "$(dirname "$0")/.."
INVOKE=${INVOKE:-.venv/bin/invoke}
timed() { local t0; t0=$(date +%s%N); "$INVOKE" lab.up >&2; echo $(( ($(date +%s%N) - t0) / 1000000 )); }
"$INVOKE" lab.down --purge >&2
cold=$(timed)
"$INVOKE" lab.down >&2
warm=$(timed)
running=$(timed)
"$INVOKE" lab.down >&2
echo "lab.up cold: ${cold} ms; warm (after lab.down): ${warm} ms; on a running lab: ${running} ms"
