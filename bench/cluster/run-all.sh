#!/bin/sh
# The documented runs, one after the other (each tears its cluster down before the next).
cd "$(dirname "$0")/../.." || exit 1
set -e
python3 bench/cluster fig4 --size 1G --runs 3
python3 bench/cluster single --size 1G --runs 3
python3 bench/cluster fig5 --size 256M --runs 3
python3 bench/cluster blast --runs 3
