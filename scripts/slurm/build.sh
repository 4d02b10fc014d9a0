#!/bin/bash
# Builds the PADLL SPANK plugin: OUTDIR/padll_spank.so.
#
#   scripts/slurm/build.sh OUTDIR [--library PATH]
#
# --library is the libpadll.so the plugin preloads unless plugstack.conf says
# `library=…`: an absolute path without a space, ':', '"' or '\' (default:
# /usr/local/lib/padll/libpadll.so, where `scripts/install.sh` puts it for the prefix
# /usr/local). Needs a C compiler and slurm/spank.h (Debian:
# gcc libslurm-dev). Install the .so where slurmstepd, srun and sbatch can read it
# (every node and login node) and add to plugstack.conf:
#
#   optional /usr/local/lib/padll/padll_spank.so default=off socket=/run/cheferd/local.sock
#            config=/usr/local/etc/cheferd/padll.toml controller_uid=cheferd
#
# (controller_uid=: the user cheferd local runs as; the stage refuses rules from others.)
set -euo pipefail
usage() {
  echo "usage: $0 OUTDIR [--library PATH]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
OUT=$1
shift
LIBRARY=/usr/local/lib/padll/libpadll.so
while [ $# -gt 0 ]; do
  case "$1" in
    --library) [ $# -ge 2 ] || usage; LIBRARY=$2; shift 2 ;;
    *) usage ;;
  esac
done
case "$LIBRARY" in /*) ;; *) echo "$0: --library $LIBRARY must be an absolute path" >&2; exit 2 ;; esac
# A space or ':' would split LD_PRELOAD; a quote or backslash, the C string it is built into.
case "$LIBRARY" in
  *[[:space:]:\"\\]*) echo "$0: --library '$LIBRARY' must not contain a space, ':', '\"' or '\\'" >&2; exit 2 ;;
esac
[ -f /usr/include/slurm/spank.h ] || { echo "$0: no /usr/include/slurm/spank.h (install libslurm-dev)" >&2; exit 1; }
mkdir -p "$OUT"
SRC=$(dirname "$0")/padll_spank.c
"${CC:-cc}" -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -fPIC -shared \
  -DPADLL_DEFAULT_LIBRARY="\"$LIBRARY\"" -o "$OUT/padll_spank.so" "$SRC"
echo "$OUT/padll_spank.so"
