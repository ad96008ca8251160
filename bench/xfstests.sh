#!/usr/bin/env bash
# xfstests' generic "quick" group on morris and on ext4, side by side.
#
# Sets up, for one run:
#   * morris: two local volumes (TEST and SCRATCH), each MORRIS_SERVERS
#     `morris server` processes on 127.0.0.1 and `morris format`; xfstests
#     mounts them as FSTYP=fuse, FUSE_SUBTYP=.morris through a helper this
#     script writes to /sbin/mount.fuse.morris (mount(8) runs it as
#     `mount.fuse.morris SOURCE MOUNTPOINT -o OPTIONS`; it starts
#     `morris mount SOURCE MOUNTPOINT --background`), and unmounts them with
#     plain umount (the `morris mount` daemon exits when its mount goes);
#   * ext4: two sparse 4 GiB files on loop devices, TEST made with mkfs.ext4
#     (SCRATCH is made by the tests themselves).
# Then runs every test once per file system, ext4 first, then morris, each
# test as its own `./check generic/NNN` under a watchdog (`timeout`, in a
# session of its own so that whatever the test started is killed too): a
# test still running after TEST_TIMEOUT minutes is killed and counted as
# failed ("timeout"). Prints passed / failed / not run per file system, the
# failures of each, and the tests that fail on morris but not on ext4 (with
# the first line of their diff). Everything it started is stopped, unmounted
# and detached at the end (also on Ctrl-C).
#
# Needs root, Debian 12, /dev/fuse. Installs the Debian packages xfstests
# needs (only those missing), creates the users fsgqa, fsgqa2, 123456-fsgqa
# (and group fsgqa) if missing, and builds the xfstests tree if it is not
# built. The tree is patched in place (one sed, see patch_xfstests):
# xfstests' _fs_type reports a FUSE mount as "fuse.SUBTYPE", which it
# accepts only for glusterfs and ceph-fuse; "fuse.morris" is mapped to
# "fuse".
#
#   git clone https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git /var/tmp/xfstests
#   MORRIS=target/release/morris bench/xfstests.sh /var/tmp/xfstests      # all 633 tests: hours
#   bench/xfstests.sh --first 100 /var/tmp/xfstests                         # the first 100 of the group
#   bench/xfstests.sh --every 3 /var/tmp/xfstests     # every third test (1st, 4th, ...): a spread sample
#   TESTS="generic/001 generic/013" bench/xfstests.sh /var/tmp/xfstests      # just these
#   bench/xfstests.sh --minutes 60 /var/tmp/xfstests   # start no new test after 60 min (both fs stay on the same tests)
#
# Environment (defaults in brackets):
#   XFSTESTS_DIR   the xfstests tree, if not given as the argument
#   MORRIS         the morris binary [`morris` in PATH, else target/release/morris]
#   WORK           scratch directory: volumes, images, mount points, results [/var/tmp/xfstests-run]
#   FS             file systems to run, in this order ["ext4 morris"]
#   TESTS          tests to run instead of the whole quick group
#   TEST_TIMEOUT   watchdog, minutes per test [10]
#   PORT           first port of the morris servers [17900]
#   MORRIS_SERVERS servers per morris volume [4]
#   MORRIS_SUID_DEV  1: the helper mounts with --suid --dev unless told nosuid/nodev,
#                  as mount(8) mounts ext4 (it passes no "suid"/"dev" to helpers: they
#                  are its defaults); 0: morris's own default, nosuid,nodev [1]
#   IMAGE_SIZE     size of each ext4 image [4G]
#   MORRIS_IMAGE_SIZE  size of the ext4 image each morris volume's servers keep
#                  their data on (all servers of a volume share it), so that tests
#                  that fill the file system fill that, not the host's disk [8G]
# Results: $WORK/results/{ext4,morris}/ (xfstests' own result directories,
# with .out.bad, .full, .dmesg per test), $WORK/results/{ext4,morris}/log/
# (check's output per test), and $WORK/results/summary.tsv (one line per
# test: name, ext4 result, morris result, seconds each, morris's reason).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

FIRST=0
EVERY=1
MINUTES=0
while [ $# -gt 0 ]; do
  case $1 in
    --first) FIRST=${2:?--first N}; shift 2 ;;
    --every) EVERY=${2:?--every K}; shift 2 ;;
    --minutes) MINUTES=${2:?--minutes M}; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage 2 >&2 ;;
    *) XFSTESTS_DIR=$1; shift ;;
  esac
done
XFSTESTS_DIR=${XFSTESTS_DIR:?give the xfstests tree as argument or XFSTESTS_DIR}
XFSTESTS_DIR=$(cd "$XFSTESTS_DIR" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${MORRIS:-}" ]; then
  MORRIS=$(command -v morris || echo "$REPO/target/release/morris")
fi
MORRIS=$(realpath "$MORRIS")
WORK=${WORK:-/var/tmp/xfstests-run}
FS=${FS:-ext4 morris}
TEST_TIMEOUT=${TEST_TIMEOUT:-10}
PORT=${PORT:-17900}
MORRIS_SERVERS=${MORRIS_SERVERS:-4}
MORRIS_SUID_DEV=${MORRIS_SUID_DEV:-1}
IMAGE_SIZE=${IMAGE_SIZE:-4G}
MORRIS_IMAGE_SIZE=${MORRIS_IMAGE_SIZE:-8G}
HELPER=/sbin/mount.fuse.morris
HELPER_MARK="written by morris bench/xfstests.sh"

[ "$(id -u)" -eq 0 ] || { echo "xfstests.sh: run as root" >&2; exit 1; }
[ -x "$MORRIS" ] || { echo "xfstests.sh: no morris binary at $MORRIS (set MORRIS)" >&2; exit 1; }
[ -f "$XFSTESTS_DIR/check" ] || { echo "xfstests.sh: $XFSTESTS_DIR is not an xfstests tree" >&2; exit 1; }
log() { echo "xfstests.sh: $*" >&2; }

# --- packages, users, build ---------------------------------------------------
PACKAGES=(xfsprogs xfslibs-dev uuid-dev libtool-bin e2fsprogs automake gcc libuuid1 quota attr acl
          make libacl1-dev libattr1-dev libaio-dev libgdbm-dev liburing-dev libcap-dev gawk fio dbench
          python3 sqlite3 bc dump xfsdump psmisc indent pkg-config fuse3 util-linux)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

getent group fsgqa >/dev/null || groupadd fsgqa
id fsgqa >/dev/null 2>&1 || useradd -m -g fsgqa fsgqa
id fsgqa2 >/dev/null 2>&1 || useradd -m fsgqa2
id 123456-fsgqa >/dev/null 2>&1 || useradd --badname -m 123456-fsgqa

if [ ! -x "$XFSTESTS_DIR/ltp/fsstress" ] || [ ! -f "$XFSTESTS_DIR/tests/generic/group.list" ]; then
  log "building xfstests in $XFSTESTS_DIR"
  make -C "$XFSTESTS_DIR" -j"$(nproc)" >"$XFSTESTS_DIR/build.log" 2>&1 ||
    { tail -20 "$XFSTESTS_DIR/build.log" >&2; exit 1; }
fi

# xfstests accepts "fuse.glusterfs" and "fuse.ceph-fuse" as FUSE types; a
# mount.fuse.morris mount shows as "fuse.morris", which must read as "fuse".
patch_xfstests() {
  grep -q 'fuse\\.morris' "$XFSTESTS_DIR/common/rc" && return
  sed -i "s|-e 's/fuse.ceph-fuse/ceph-fuse/'|& -e 's/^fuse\\\\.morris\$/fuse/'|" "$XFSTESTS_DIR/common/rc"
  grep -q 'fuse\\.morris' "$XFSTESTS_DIR/common/rc" ||
    { log "could not patch _fs_type in $XFSTESTS_DIR/common/rc"; exit 1; }
}
patch_xfstests

# --- the test list --------------------------------------------------------------
if [ -n "${TESTS:-}" ]; then
  read -ra LIST <<< "$TESTS"
else
  mapfile -t LIST < <(awk '/^[0-9]/ && / quick( |$)/ {print "generic/" $1}' "$XFSTESTS_DIR/tests/generic/group.list")
fi
if [ "$EVERY" -gt 1 ]; then
  all=("${LIST[@]}"); LIST=()
  for ((i = 0; i < ${#all[@]}; i += EVERY)); do LIST+=("${all[i]}"); done
fi
[ "$FIRST" -gt 0 ] && LIST=("${LIST[@]:0:$FIRST}")
log "${#LIST[@]} tests on: $FS"

# --- set-up and clean-up ------------------------------------------------------------
SERVER_PIDS=()
LOOPS=()
CHECK_SID=
HELPER_BACKUP=
mkdir -p "$WORK"
if awk '{print $5}' /proc/self/mountinfo | grep -q "^$WORK/"; then
  log "something is mounted under $WORK (a previous run?): unmount it first"; exit 1
fi
RES=$WORK/results
rm -rf "$RES" "$WORK/morris" "$WORK/ext4"
mkdir -p "$RES"

cleanup() {
  set +e
  trap - EXIT INT TERM
  [ -n "$CHECK_SID" ] && kill_session "$CHECK_SID"
  # Every mount under $WORK is ours (the test and scratch mounts, and what
  # tests mounted below them); deepest first. The morris servers' data file
  # systems (*-data) go after the servers.
  awk '{print $5}' /proc/self/mountinfo | grep "^$WORK/" | grep -v -- '-data$' | sort -r |
    while read -r m; do unstick "$m"; done
  # `morris mount` daemons exit when unmounted; one that did not is killed
  # (checked to be ours: a pid may have been reused since).
  if [ -f "$WORK/morris/mount.pids" ]; then
    while read -r p; do
      if [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$MORRIS" ] &&
         tr '\0' ' ' < "/proc/$p/cmdline" | grep -q " $WORK/morris/"; then
        kill "$p"
      fi
    done < "$WORK/morris/mount.pids"
  fi
  for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${SERVER_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  awk '{print $5}' /proc/self/mountinfo | grep "^$WORK/morris/.*-data$" |
    while read -r m; do umount "$m" || umount -l "$m"; done
  # Loop devices: ours, and any a test left on a file under $WORK.
  for d in "${LOOPS[@]}"; do losetup -d "$d"; done
  losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v w="$WORK/" 'index($2, w) == 1 {print $1}' |
    while read -r d; do losetup -d "$d"; done
  if grep -qs "$HELPER_MARK" "$HELPER"; then rm -f "$HELPER"; fi
  [ -n "$HELPER_BACKUP" ] && mv "$HELPER_BACKUP" "$HELPER"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Kills every process left in session $1 (a test and what it started).
kill_session() {
  local pids
  for sig in TERM KILL; do
    pids=$(ps -eo pid=,sid= | awk -v s="$1" '$2 == s {print $1}')
    [ -n "$pids" ] || return 0
    kill -"$sig" $pids 2>/dev/null
    sleep 2
  done
}

setup_ext4() {
  local d=$WORK/ext4 dev
  mkdir -p "$d/test" "$d/scratch"
  for which in test scratch; do
    truncate -s "$IMAGE_SIZE" "$d/$which.img"
    dev=$(losetup -f --show "$d/$which.img")
    LOOPS+=("$dev")
    eval "EXT4_${which^^}_DEV=$dev"
  done
  mkfs.ext4 -q -F "$EXT4_TEST_DEV"
  cat > "$d/config" <<EOF
export FSTYP=ext4
export TEST_DEV=$EXT4_TEST_DEV
export TEST_DIR=$d/test
export SCRATCH_DEV=$EXT4_SCRATCH_DEV
export SCRATCH_MNT=$d/scratch
export RESULT_BASE=$RES/ext4
EOF
}

# One volume: MORRIS_SERVERS servers from port $2, their data on an ext4
# image of MORRIS_IMAGE_SIZE mounted at $WORK/morris/$1-data; formatted.
start_volume() {
  local name=$1 port=$2 i addrs= dev data=$WORK/morris/$1-data
  truncate -s "$MORRIS_IMAGE_SIZE" "$WORK/morris/$name.img"
  dev=$(losetup -f --show "$WORK/morris/$name.img")
  LOOPS+=("$dev")
  mkfs.ext4 -q -F "$dev"
  mkdir -p "$data"
  mount "$dev" "$data"
  for ((i = 0; i < MORRIS_SERVERS; i++)); do
    if ss -Hltn "sport = :$((port + i))" | grep -q .; then
      log "port $((port + i)) is in use (set PORT)"; exit 1
    fi
    "$MORRIS" server --data "$data/$i" --listen "127.0.0.1:$((port + i))" \
      --key "$WORK/morris/keys/volume.key" > "$WORK/morris/$name-$i.log" 2>&1 &
    SERVER_PIDS+=($!)
    addrs+=${addrs:+,}127.0.0.1:$((port + i))
  done
  for _ in $(seq 50); do
    ss -Hltn "sport = :$((port + MORRIS_SERVERS - 1))" | grep -q . && break; sleep 0.2
  done
  "$MORRIS" format --servers "$addrs" --key "$WORK/morris/keys/volume.key" > "$WORK/morris/$name-format.log"
}

setup_morris() {
  local d=$WORK/morris
  mkdir -p "$d/test" "$d/scratch"
  "$MORRIS" key new "$d/keys" > /dev/null
  start_volume test "$PORT"
  start_volume scratch $((PORT + MORRIS_SERVERS))
  local noatime= strictatime=
  "$MORRIS" mount --help | grep -q -- '--noatime' && noatime=1
  "$MORRIS" mount --help | grep -q -- '--strictatime' && strictatime=1
  if [ -e "$HELPER" ] && ! grep -qs "$HELPER_MARK" "$HELPER"; then
    HELPER_BACKUP=$WORK/mount.fuse.morris.orig
    mv "$HELPER" "$HELPER_BACKUP"
  fi
  # The helper mount(8) runs for -t fuse.morris. It prints nothing on
  # success (xfstests compares mount's output with the expected output).
  cat > "$HELPER" <<EOF
#!/bin/bash
# mount.fuse.morris: $HELPER_MARK, removed at its end.
# mount(8) runs: mount.fuse.morris SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS]
set -uo pipefail
src=\$1 mnt=\$2; shift 2
opts=
while [ \$# -gt 0 ]; do
  case \$1 in
    -o) opts=\${opts:+\$opts,}\$2; shift 2 ;;
    -o*) opts=\${opts:+\$opts,}\${1#-o}; shift ;;
    -t|-N) shift 2 ;;
    *) shift ;;
  esac
done
# A remount changes the flags of the mount that is there: do what mount(8)
# does for a type without a helper.
case ",\$opts," in *,remount,*) exec mount -i -o "\$opts" "\$mnt" ;; esac
# mount(8) passes nosuid and nodev, never suid and dev (its defaults).
args=() ro= suid=$MORRIS_SUID_DEV dev=$MORRIS_SUID_DEV
IFS=, read -ra list <<< "\$opts"
for o in "\${list[@]}"; do
  case \$o in
    ro) ro=1 ;;
    rw) ro= ;;
    suid) suid=1 ;;
    nosuid) suid=0 ;;
    dev) dev=1 ;;
    nodev) dev=0 ;;
    noatime) [ -n "$noatime" ] && args+=(--noatime) ;;
    strictatime) [ -n "$strictatime" ] && args+=(--strictatime) ;;
    # allow_other and default_permissions: a morris mount behaves so
    # already; anything else is not a morris option.
    *) ;;
  esac
done
[ -n "\$ro" ] && args+=(--read-only)
[ "\$suid" = 1 ] && args+=(--suid)
[ "\$dev" = 1 ] && args+=(--dev)
log=$d/mount-\${src//[^0-9A-Za-z.]/_}.log
if ! out=\$("$MORRIS" mount "\$src" "\$mnt" --background --key "$d/keys/client.key" \\
           --fsname "\$src" --log "\$log" "\${args[@]}" 2>&1); then
  echo "\$out" >&2
  exit 32
fi
echo "\$out" >> "\$log"
sed -n 's/.*(pid \([0-9]*\)).*/\1/p' <<< "\$out" >> "$d/mount.pids"
EOF
  chmod 755 "$HELPER"
  cat > "$d/config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.morris
export TEST_DEV=127.0.0.1:$PORT
export TEST_DIR=$d/test
export SCRATCH_DEV=127.0.0.1:$((PORT + MORRIS_SERVERS))
export SCRATCH_MNT=$d/scratch
export RESULT_BASE=$RES/morris
EOF
}

for fs in $FS; do
  case $fs in
    ext4) setup_ext4 ;;
    morris) setup_morris ;;
    *) log "unknown file system $fs (ext4, morris)"; exit 2 ;;
  esac
  mkdir -p "$RES/$fs/log"
done

# --- running ----------------------------------------------------------------------
# A mount left hanging by a killed test: abort its FUSE connection, then
# unmount it (lazily if it is still busy). Reads /proc, never the mount.
unstick() {
  local m=$1 id
  id=$(awk -v m="$m" '$5 == m {split($3, d, ":"); print d[2]}' /proc/self/mountinfo | tail -1)
  [ -n "$id" ] || return 0
  if ! timeout -k 5 10 stat -f "$m" >/dev/null 2>&1 && [ -e "/sys/fs/fuse/connections/$id/abort" ]; then
    echo 1 > "/sys/fs/fuse/connections/$id/abort"
  fi
  umount -c "$m" 2>/dev/null || umount -c -l "$m" 2>/dev/null || true
}

# Runs test $2 on file system $1; sets R (passed, failed, notrun, timeout,
# error) and S (seconds).
run_one() {
  local fs=$1 t=$2 out rc start
  out=$RES/$fs/log/${t//\//-}.log
  start=$(date +%s)
  # setsid: the test and everything it starts are in a session of their own.
  ( cd "$XFSTESTS_DIR" && export HOST_OPTIONS=$WORK/$fs/config &&
    exec setsid timeout -k 30 "${TEST_TIMEOUT}m" ./check "$t" ) > "$out" 2>&1 &
  CHECK_SID=$!
  rc=0; wait "$CHECK_SID" || rc=$?
  kill_session "$CHECK_SID"; CHECK_SID=
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    R=timeout
    echo "xfstests.sh: killed after $TEST_TIMEOUT min" >> "$out"
    unstick "$WORK/$fs/scratch"; unstick "$WORK/$fs/test"
  elif grep -q '^Failures:' "$out"; then R=failed
  elif grep -q '^Not run:' "$out"; then R=notrun
  elif grep -q '^Passed all' "$out"; then R=passed
  else R=error   # check itself failed (could not mount, ...): counted as failed
  fi
  S=$(($(date +%s) - start))
}

# Why test $2 failed on $1, in one line: the first line of its diff, or so.
reason() {
  local fs=$1 t=$2 r=$3 bad=$RES/$1/$2.out.bad first
  case $r in
    timeout) echo "killed after $TEST_TIMEOUT min"; return ;;
    error) grep -v '^ *$' "$RES/$fs/log/${t//\//-}.log" | tail -1; return ;;
  esac
  if [ -f "$bad" ]; then
    first=$(diff "$XFSTESTS_DIR/tests/$t.out" "$bad" | grep -m1 '^[<>]' || true)
    echo "${first:-output matches; see log}"
  elif [ -f "$RES/$fs/$t.dmesg" ]; then echo "kernel messages in dmesg"
  else grep -m1 -e '\[failed' -e '_check' "$RES/$fs/log/${t//\//-}.log" || echo "see log"
  fi
}

START=$(date +%s)
HEADER="xfstests $(git -C "$XFSTESTS_DIR" log -1 --format=%h 2>/dev/null), kernel $(uname -r), $MORRIS ($("$MORRIS" --version); this repository at $(git -C "$REPO" log -1 --format=%h 2>/dev/null)), started $(date -u '+%F %H:%M UTC')"
log "$HEADER"
printf 'test\text4\tmorris\text4_s\tmorris_s\treason\n' > "$RES/summary.tsv"
declare -A RESULT
ran=0
for t in "${LIST[@]}"; do
  if [ "$MINUTES" -gt 0 ] && [ $(($(date +%s) - START)) -ge $((MINUTES * 60)) ]; then
    log "--minutes $MINUTES reached: stopping after $ran tests"; break
  fi
  line=$t
  for fs in ext4 morris; do
    if [[ " $FS " == *" $fs "* ]]; then
      run_one "$fs" "$t"
      RESULT[$fs,$t]=$R
      r=$R s=$S
      line+=" $fs:$r(${s}s)"
    else
      RESULT[$fs,$t]=-; r=- s=-
    fi
    eval "r_$fs=\$r s_$fs=\$s"
  done
  why=
  case $r_morris in failed|timeout|error) why=$(reason morris "$t" "$r_morris") ;; esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$r_ext4" "$r_morris" "$s_ext4" "$s_morris" "$why" >> "$RES/summary.tsv"
  ran=$((ran + 1))
  echo "[$ran/${#LIST[@]} $(( ($(date +%s) - START) / 60 )) min] $line"
done

# --- summary ------------------------------------------------------------------------
echo
echo "$HEADER; $ran tests of the generic quick group"
printf '%-10s %8s %8s %8s %10s\n' "" passed failed "not run" "(timeout)"
for fs in $FS; do
  p=0 f=0 n=0 to=0
  for t in "${LIST[@]:0:$ran}"; do
    case ${RESULT[$fs,$t]} in
      passed) p=$((p + 1)) ;;
      notrun) n=$((n + 1)) ;;
      timeout) f=$((f + 1)); to=$((to + 1)) ;;
      *) f=$((f + 1)) ;;
    esac
  done
  printf '%-10s %8d %8d %8d %10d\n' "$fs" $p $f $n $to
done
for fs in $FS; do
  echo
  echo "failed on $fs:"
  for t in "${LIST[@]:0:$ran}"; do
    case ${RESULT[$fs,$t]} in failed|timeout|error) echo "  $t (${RESULT[$fs,$t]})" ;; esac
  done
done
if [[ " $FS " == *" ext4 "* && " $FS " == *" morris "* ]]; then
  echo
  echo "failed on morris, not on ext4:"
  awk -F'\t' 'NR > 1 && $3 ~ /failed|timeout|error/ && $2 !~ /failed|timeout|error/ {printf "  %s (ext4: %s): %s\n", $1, $2, $6}' "$RES/summary.tsv"
fi
echo
echo "results: $RES (summary.tsv; per test: {ext4,morris}/generic/NNN.out.bad, .full; log/)"
