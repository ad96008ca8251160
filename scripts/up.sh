#!/usr/bin/env bash
# One command to a running morris: set-up, release build, then `morris up`
# (4 servers on 127.0.0.1:7700-7703, data in ./morris-data, mounted at ./mnt).
# Arguments are passed to `morris up` (see `morris up --help`). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
if [ -d "$HOME/.cargo/bin" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
cargo build --release -p morris-cli
exec target/release/morris up "$@"
