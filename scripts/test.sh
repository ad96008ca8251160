#!/usr/bin/env bash
# The project's test command: set-up, formatting, lints, every test.
# The tests mount FUSE file systems; without FUSE this fails (never skips).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
if [ -d "$HOME/.cargo/bin" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

fail() {
    echo "test.sh: error: $*" >&2
    exit 1
}
[ -c /dev/fuse ] ||
    fail "/dev/fuse is missing; the tests mount FUSE file systems (load the fuse module, or run the container with --device /dev/fuse --cap-add SYS_ADMIN)"
[ -r /dev/fuse ] && [ -w /dev/fuse ] ||
    fail "/dev/fuse is not readable and writable by $(id -un); run as root or fix its permissions"
command -v fusermount3 >/dev/null 2>&1 ||
    fail "fusermount3 not found (package fuse3; scripts/setup.sh installs it)"

# A one-off build gains nothing from incremental state, and it is a third
# of the target directory's size.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "test.sh: cargo fmt --check"
cargo fmt --all -- --check
echo "test.sh: cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "test.sh: cargo test"
cargo test --workspace
echo "test.sh: all passed"
