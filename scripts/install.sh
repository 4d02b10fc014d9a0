#!/usr/bin/env bash
# Installs PADLL-rs under a prefix: the binaries (padll, cheferd, cheferd-lab), the stage
# (PREFIX/lib/padll/libpadll.so, where padll finds it), man pages and shell
# completions generated from the binaries, sample configurations, the systemd units,
# their settings files, the cheferd user's sysusers.d entry and the tmpfiles.d line that
# makes /dev/shm/padll at boot.
#
#   scripts/install.sh [--prefix P] [--sysconfdir S] [--destdir D] [--from DIR]
#
#   --prefix P      where it goes (default /usr/local)
#   --sysconfdir S  configuration (default /etc for the prefix /usr, else P/etc)
#   --destdir D     stage the tree under D (for packaging); paths inside the files
#                   still name P and S
#   --from DIR      take the binaries from this cargo profile directory (e.g.
#                   target/debug) instead of target/release
#
# Without --from it runs the README's `cargo build --release` (the whole workspace, so
# the same features: nothing is compiled again after that build), or, where cargo is not
# on PATH (sudo's secure_path drops ~/.cargo/bin), installs what target/release holds.
#
# Existing configuration (S/cheferd/*.toml, S/default/cheferd-*) is never overwritten.
# Nothing is started or enabled, and no user is created: see README, "Deploying on a
# cluster".
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
prefix=/usr/local
sysconfdir=
destdir=
from=

die() {
  echo "install.sh: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix | --sysconfdir | --destdir | --from)
      [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
      case "$1" in
        --prefix) prefix="$2" ;;
        --sysconfdir) sysconfdir="$2" ;;
        --destdir) destdir="$2" ;;
        --from) from="$2" ;;
      esac
      shift 2
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

for path in "$prefix" ${sysconfdir:+"$sysconfdir"}; do
  case "$path" in
    /*) ;;
    *) die "'$path' is not an absolute path" ;;
  esac
  # The units and LD_PRELOAD cannot hold these.
  case "$path" in
    *[[:space:]:]*) die "'$path' contains a space or ':'" ;;
  esac
done
prefix="${prefix%/}"
[ -n "$sysconfdir" ] || if [ "$prefix" = /usr ]; then sysconfdir=/etc; else sysconfdir="$prefix/etc"; fi

build_first="build it first (cargo build --release)"
if [ -z "$from" ]; then
  from="${CARGO_TARGET_DIR:-$root/target}/release"
  if command -v cargo >/dev/null; then
    cargo build --release --locked --manifest-path "$root/Cargo.toml"
  else
    build_first="no cargo on PATH to build it (sudo drops ~/.cargo/bin): run \`cargo build --release\` first, without sudo"
  fi
fi
library="$(ls -t "$from/libpadll.so" "$from/deps/libpadll.so" 2>/dev/null | head -n 1 || true)"
for file in "$from/padll" "$from/cheferd" "$from/cheferd-lab" "$library"; do
  [ -f "$file" ] || die "${file:-$from/libpadll.so} is missing: $build_first"
done

bin="$prefix/bin"
share="$prefix/share"
# Completions where each shell looks for them (Debian's zsh reads vendor-completions).
zsh_dir="$share/zsh/site-functions"
[ "$prefix" = /usr ] && zsh_dir="$share/zsh/vendor-completions"

dest() { printf '%s%s' "$destdir" "$1"; }
put() { # put MODE SOURCE DIR [NAME]
  install -D -m "$1" "$2" "$(dest "$3")/${4:-$(basename "$2")}"
}
# Copies a file unless the admin's copy is already there.
put_config() { # put_config SOURCE DIR
  if [ -e "$(dest "$2")/$(basename "$1")" ]; then
    echo "kept $2/$(basename "$1")"
  else
    put 644 "$1" "$2"
  fi
}

put 755 "$from/padll" "$bin"
put 755 "$from/cheferd" "$bin"
put 755 "$from/cheferd-lab" "$bin"
put 644 "$library" "$prefix/lib/padll"

generated="$(mktemp -d)"
trap 'rm -rf "$generated"' EXIT
for program in padll cheferd cheferd-lab; do
  "$from/$program" generate man "$generated/man"
  "$from/$program" generate completions "$generated/completions"
  put 644 "$generated/completions/$program.bash" "$share/bash-completion/completions" "$program"
  put 644 "$generated/completions/_$program" "$zsh_dir"
  put 644 "$generated/completions/$program.fish" "$share/fish/vendor_completions.d"
done
for page in "$generated"/man/*.[15]; do
  put 644 "$page" "$share/man/man${page##*.}"
done

docs="$share/doc/padll"
for file in README.md ARCHITECTURE.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE; do
  put 644 "$root/$file" "$docs"
done
for guide in "$root"/docs/*.md; do
  put 644 "$guide" "$docs/docs"
done
for sample in "$root"/etc/*.toml; do
  [ -e "$sample" ] || continue
  put 644 "$sample" "$docs/examples"
  put_config "$sample" "$sysconfdir/cheferd"
done
for settings in "$root"/etc/default/*; do
  put_config "$settings" "$sysconfdir/default"
done

# The units name the installed paths.
units="$prefix/lib/systemd/system"
for unit in "$root"/etc/systemd/*.service; do
  install -d "$(dest "$units")"
  sed -e "s#/usr/bin/cheferd#$bin/cheferd#g" \
    -e "s#/etc/cheferd#$sysconfdir/cheferd#g" \
    -e "s#/etc/default/#$sysconfdir/default/#g" \
    "$unit" >"$(dest "$units")/$(basename "$unit")"
  chmod 644 "$(dest "$units")/$(basename "$unit")"
done
put 644 "$root/etc/sysusers.d/cheferd.conf" "$prefix/lib/sysusers.d"

# Root's directory of the per-user directories that hold jobs' files in /dev/shm
# (padll-wire/src/node_files.rs): made at boot, before any job, so no other user can
# take its name. The per-user directories come from the SPANK plugin or a root prolog.
install -d "$(dest "$prefix/lib/tmpfiles.d")"
cat >"$(dest "$prefix/lib/tmpfiles.d")/padll.conf" <<'TMPFILES'
# PADLL: jobs keep their shared token buckets and last rules in /dev/shm/padll/<uid>/.
d /dev/shm/padll 0711 root root -
TMPFILES
chmod 644 "$(dest "$prefix/lib/tmpfiles.d")/padll.conf"

echo "installed PADLL-rs $("$from/cheferd" --version | cut -d' ' -f2-) under ${destdir}$prefix (configuration: ${destdir}$sysconfdir)"
