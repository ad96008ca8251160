#!/usr/bin/env bash
# Installs what morris needs on a Debian 12 machine. Safe to run again: it
# only calls apt-get when a package is missing.
set -euo pipefail

PACKAGES=(fuse3 libfuse3-dev attr acl pkg-config libnfs-utils libnfs-dev fio rpcbind iproute2 libclang-dev etcd-server protobuf-compiler nfs-ganesha nfs-ganesha-vfs python3 faketime rsync prometheus chromium)
MIN_RUST=1.89

die() {
    echo "setup.sh: error: $*" >&2
    exit 1
}

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    fi
fi
as_root() {
    if [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; then
        die "need root (or sudo) to run: $*"
    fi
    "${SUDO[@]}" "$@"
}

# --- system packages -------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by hand: ${missing[*]}"
    echo "setup.sh: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
        die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" || die "apt-get install ${missing[*]} failed"
fi
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
        die "package $p is still not installed"
done

# `morris mount` lets every user use a mount by default; for non-root users
# that needs user_allow_other in /etc/fuse.conf.
if ! grep -qE '^[[:space:]]*user_allow_other[[:space:]]*$' /etc/fuse.conf 2>/dev/null; then
    echo "setup.sh: enabling user_allow_other in /etc/fuse.conf"
    echo 'user_allow_other' | as_root tee -a /etc/fuse.conf >/dev/null ||
        die "cannot update /etc/fuse.conf"
fi

# --- Rust toolchain ----------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 ||
    die "cargo not found: install Rust $MIN_RUST or newer (https://rustup.rs), then rerun"
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$MIN_RUST" "$have" | sort -V | head -n1)" != "$MIN_RUST" ]; then
    if command -v rustup >/dev/null 2>&1; then
        echo "setup.sh: Rust $have is older than $MIN_RUST; updating the stable toolchain"
        rustup update stable || die "rustup update failed"
    else
        die "Rust $have is older than $MIN_RUST; install a newer toolchain"
    fi
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 || die "cargo fmt / cargo clippy missing and no rustup to add them"
    echo "setup.sh: adding rustfmt and clippy"
    rustup component add rustfmt clippy || die "rustup component add failed"
fi

# --- FUSE device -------------------------------------------------------------
if [ ! -c /dev/fuse ] && [ "$(id -u)" -eq 0 ]; then
    modprobe fuse 2>/dev/null || true
fi
if [ ! -c /dev/fuse ]; then
    echo "setup.sh: WARNING: /dev/fuse is missing: servers run, but mounting (and the tests) will" >&2
    echo "setup.sh: WARNING: fail. Load the fuse module, or start the container with --device /dev/fuse." >&2
fi
echo "setup.sh: ok"
