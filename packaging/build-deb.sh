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
# start the unit: edit /etc/fencecron/jobs.toml first.
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
echo "$out_dir/fencecron_${version}_${arch}.deb"
