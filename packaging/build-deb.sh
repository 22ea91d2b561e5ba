#!/usr/bin/env bash
# Builds fencecron_<version>_<arch>.deb with dpkg-deb from built binaries:
#   packaging/build-deb.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR holds fencecron and fencecron-shim (default: target/release, built
# with `cargo build --release` first); OUT_DIR defaults to target/debian.
# DEB_COMPRESS=gzip:1 trades size for speed (default xz, dpkg-deb's).
#
# The package installs the binaries in /usr/bin, the unit in
# /lib/systemd/system, an example /etc/fencecron/jobs.toml (a conffile: an
# edited one survives upgrades), shell completions and man pages generated
# by the binary itself, the README and RECIPES under /usr/share/doc, and
# creates the `fencecron` system user on install. It does not enable or
# start the unit: edit /etc/fencecron/jobs.toml first. The binaries are
# stripped; fencecron-dbgsym_<version>_<arch>.deb, written beside it, holds
# their debug information.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin_dir="${1:-$root/target/release}"
out_dir="${2:-$root/target/debian}"
bin="$bin_dir/fencecron"
[ -x "$bin" ] && [ -x "$bin_dir/fencecron-shim" ] || {
    echo "build-deb: no fencecron and fencecron-shim in $bin_dir; run cargo build --release first" >&2
    exit 2
}
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
arch="$(dpkg --print-architecture)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
pkg="$stage/fencecron_${version}_${arch}"

install -d -m 0755 "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" \
    "$pkg/etc/fencecron" "$pkg/usr/share/man/man1" "$pkg/usr/share/doc/fencecron" \
    "$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/zsh/vendor-completions" \
    "$pkg/usr/share/fish/vendor_completions.d"
install -m 0755 "$bin" "$bin_dir/fencecron-shim" "$pkg/usr/bin/"
# Stripped binaries in the package; their debug information goes to the
# fencecron-dbgsym package as /usr/lib/debug/.build-id/XX/YYYY.debug, where
# gdb, addr2line (-e that file) and debuginfod-style tools look it up by the
# binary's build id (Debian's own dbgsym layout).
dbg="$stage/fencecron-dbgsym_${version}_${arch}"
for b in fencecron fencecron-shim; do
    id="$(readelf -n "$pkg/usr/bin/$b" | sed -n 's/^ *Build ID: *//p')"
    [ -n "$id" ] || { echo "build-deb: $b has no build id; cannot split its debug information" >&2; exit 2; }
    debug="$dbg/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
    install -d -m 0755 "$(dirname "$debug")"
    objcopy --only-keep-debug --compress-debug-sections "$pkg/usr/bin/$b" "$debug"
    chmod 0644 "$debug"
    objcopy --strip-debug --strip-unneeded --remove-section=.gnu_debuglink \
        --add-gnu-debuglink="$debug" "$pkg/usr/bin/$b"
done
# The unit as shipped names /usr/local/bin (a manual install); the package
# installs to /usr/bin.
sed 's|/usr/local/bin/|/usr/bin/|g' "$root/systemd/fencecron.service" \
    > "$pkg/lib/systemd/system/fencecron.service"
chmod 0644 "$pkg/lib/systemd/system/fencecron.service"
install -m 0640 "$root/jobs.example.toml" "$pkg/etc/fencecron/jobs.toml"
"$bin" completions bash > "$pkg/usr/share/bash-completion/completions/fencecron"
"$bin" completions zsh > "$pkg/usr/share/zsh/vendor-completions/_fencecron"
"$bin" completions fish > "$pkg/usr/share/fish/vendor_completions.d/fencecron.fish"
"$bin" man "$pkg/usr/share/man/man1"
gzip -9n "$pkg"/usr/share/man/man1/*.1
install -m 0644 "$root/README.md" "$root/docs/RECIPES.md" "$pkg/usr/share/doc/fencecron/"
install -m 0644 "$root/deploy/prometheus/fencecron.rules.yml" "$pkg/usr/share/doc/fencecron/"

cat > "$pkg/DEBIAN/control" <<CONTROL
Package: fencecron
Version: $version
Architecture: $arch
Maintainer: fencecron developers <fencecron@localhost>
Section: admin
Priority: optional
Depends: libc6, adduser
Description: job runner with fenced execution across hosts
 Instances on several hosts compete for per-job leases in a shared SQL
 store (SQLite, PostgreSQL, MySQL/MariaDB), run each job with a fencing
 token, renew the lease, and kill the job when ownership can no longer be
 proven.
CONTROL
echo /etc/fencecron/jobs.toml > "$pkg/DEBIAN/conffiles"
cat > "$pkg/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent passwd fencecron >/dev/null; then
        adduser --system --group --no-create-home --home /var/lib/fencecron fencecron
    fi
    chgrp fencecron /etc/fencecron/jobs.toml
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null || true
    fi
fi
POSTINST
chmod 0755 "$pkg/DEBIAN/postinst"
mkdir -p "$out_dir"
compress="${DEB_COMPRESS:-xz:6}"
dpkg-deb --root-owner-group -Z"${compress%%:*}" -z"${compress##*:}" --build "$pkg" "$out_dir/" >/dev/null

install -d -m 0755 "$dbg/DEBIAN"
cat > "$dbg/DEBIAN/control" <<CONTROL
Package: fencecron-dbgsym
Version: $version
Architecture: $arch
Maintainer: fencecron developers <fencecron@localhost>
Section: debug
Priority: optional
Depends: fencecron (= $version)
Description: debug symbols for fencecron
 The debug information stripped from fencecron and fencecron-shim, found
 by gdb and addr2line through the binaries' build ids.
CONTROL
dpkg-deb --root-owner-group -Z"${compress%%:*}" -z"${compress##*:}" --build "$dbg" "$out_dir/" >/dev/null
echo "build-deb: debug symbols in $out_dir/fencecron-dbgsym_${version}_${arch}.deb" >&2
echo "$out_dir/fencecron_${version}_${arch}.deb"
