#!/usr/bin/env bash
# deploy/interop/run-suite.sh - interop suite against Linux soft-iWARP (siw).
#
# Boots one siw guest of the rig in ../shared/interop/siw-vm (run-peer.sh)
# and runs, in that one boot, rping and perftest (-R) cases in both roles
# against the `iwarp` tool, which joins the rig's segment as DPDK
# net_af_packet on veth-dp in netns siwdp (10.77.0.3). Every case has a
# timeout, is captured on the guest's tap, and its capture is checked with
# tshark's iWARP dissectors: no malformed frame or expert error, no
# "Bad CRC32", no RTO and retransmissions under 0.1 % of TCP segments (the
# segment is loss-free), MPA flags as configured. Captures, logs and a
# summary table land in the output folder; everything made here is torn
# down on exit, also on failure. Exit status 0 only if every case passed.
#
# Usage (as root):
#   deploy/interop/run-suite.sh [-o DIR] [--list] [PATTERN...]
# PATTERN: shell glob(s) on case names (default: all), e.g. 'rping-*'
# or 'write_bw-to-siw-crc'. See deploy/interop/README.md.
#
# Environment:
#   SIWVM_RIG      the rig's scripts (default: ../shared/interop/siw-vm
#                  relative to the repository root)
#   SIWVM_STATE    the rig's state (image, VM run dirs; default /var/tmp/siwvm)
#   IWARP_BIN      the iwarp binary (default: cargo build --release, then
#                  ${CARGO_TARGET_DIR:-<repo>/target}/release/iwarp)
#   CASE_TMO       seconds per case (default 60)
#   PERF_N         perftest iterations (default 200)
#   BW_SIZE LAT_SIZE  perftest message sizes (65536, 64)
#   RPING_C RPING_S   rping count and size (5, 100)
#   IDLE_SPIN IDLE_SLEEP_US  the dataplane's idle back-off (100, 200)
#   RETX_CHECK     0: do not check retransmissions/RTO (a lossy run)
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
RIG=${SIWVM_RIG:-$HERE/../../../shared/interop/siw-vm}
export SIWVM_STATE=${SIWVM_STATE:-/var/tmp/siwvm}
VM=a
GUEST_IP=10.77.0.11
DP_IP=10.77.0.3
DP_MAC=02:00:00:77:00:03
DP_NS=siwdp
DP_IFACE=veth-dp
TAP=tap-$VM
VMDIR=$SIWVM_STATE/run/$VM
CASE_TMO=${CASE_TMO:-60}
PERF_N=${PERF_N:-200}
BW_SIZE=${BW_SIZE:-65536}
LAT_SIZE=${LAT_SIZE:-64}
RPING_C=${RPING_C:-5}
RPING_S=${RPING_S:-100}
IDLE_SPIN=${IDLE_SPIN:-100}
IDLE_SLEEP_US=${IDLE_SLEEP_US:-200}
RETX_CHECK=${RETX_CHECK:-1}
OUT=

log() { echo "[interop $(date -u +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 2; }

# ---- the cases ---------------------------------------------------------------
# name = TEST-DIR-VARIANT. DIR: to-siw (siw serves, iwarp connects: our MPA
# request decides CRC and RTR) or from-siw (iwarp serves, siw connects).
# VARIANT: crc / nocrc (mpa.crc), rtr-write / rtr-read (peer-to-peer with
# that RTR offered; without, mpa.rtr=none).
TESTS="rping write_bw read_bw send_bw write_lat read_lat send_lat"
all_cases() {
    local t
    for t in $TESTS; do echo "$t-to-siw-crc"; done
    for t in $TESTS; do echo "$t-to-siw-nocrc"; done
    for t in rping write_bw read_bw; do
        echo "$t-to-siw-rtr-write"
        echo "$t-to-siw-rtr-read"
    done
    for t in $TESTS; do echo "$t-from-siw-crc"; done
    for t in rping write_bw; do echo "$t-from-siw-nocrc"; done
}

# Sets TEST DIR VARIANT SETS EXP_CRC EXP_P2P for case $1.
parse_case() {
    local n=$1
    TEST=${n%%-*}
    local rest=${n#*-}
    case "$rest" in
        to-siw-*) DIR=to-siw; VARIANT=${rest#to-siw-} ;;
        from-siw-*) DIR=from-siw; VARIANT=${rest#from-siw-} ;;
        *) return 1 ;;
    esac
    case " $TESTS " in *" $TEST "*) ;; *) return 1 ;; esac
    case "$VARIANT" in
        crc) SETS="mpa.crc=true mpa.rtr=none"; EXP_CRC=1; EXP_P2P=0 ;;
        nocrc) SETS="mpa.crc=false mpa.rtr=none"; EXP_CRC=0; EXP_P2P=0 ;;
        rtr-write) SETS="mpa.crc=true mpa.rtr=write"; EXP_CRC=1; EXP_P2P=1 ;;
        rtr-read) SETS="mpa.crc=true mpa.rtr=read"; EXP_CRC=1; EXP_P2P=1 ;;
        *) return 1 ;;
    esac
    # as responder, the MPA flags are siw's request answered by our policy:
    # recorded, not asserted
    [ "$DIR" = from-siw ] && { EXP_CRC=-; EXP_P2P=-; }
    return 0
}

perf_size() { case "$1" in *_bw) echo "$BW_SIZE" ;; *) echo "$LAT_SIZE" ;; esac; }
port_of() { [ "$1" = rping ] && echo 7174 || echo 18515; }

# The guest's command of a case (server for to-siw, client for from-siw).
guest_cmd() {
    local t=$TEST
    if [ "$t" = rping ]; then
        if [ "$DIR" = to-siw ]; then
            echo "rping -s -a $GUEST_IP -v -C $RPING_C -S $RPING_S"
        else
            echo "rping -c -a $DP_IP -v -C $RPING_C -S $RPING_S"
        fi
    else
        local s; s=$(perf_size "$t")
        if [ "$DIR" = to-siw ]; then
            echo "ib_$t -R -F -n $PERF_N -s $s"
        else
            echo "ib_$t -R -F -n $PERF_N -s $s $DP_IP"
        fi
    fi
}

# The iwarp tool's arguments of a case (client for to-siw, server for from-siw).
iwarp_args() {
    local t=$TEST
    if [ "$t" = rping ]; then
        if [ "$DIR" = to-siw ]; then
            echo "rping -c -a $GUEST_IP -C $RPING_C -S $RPING_S -V"
        else
            echo "rping -s -a $DP_IP -C $RPING_C -S $RPING_S -V"
        fi
    else
        local s; s=$(perf_size "$t")
        local peer=""
        [ "$DIR" = to-siw ] && peer=$GUEST_IP
        echo "perf ${t/_/-} $peer -R -F -n $PERF_N -s $s"
    fi
}

# ---- options -----------------------------------------------------------------
PATTERNS=()
LIST=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o) OUT=$2; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) PATTERNS+=("$1"); shift ;;
    esac
done
[ ${#PATTERNS[@]} -eq 0 ] && PATTERNS=('*')
CASES=()
for c in $(all_cases); do
    for p in "${PATTERNS[@]}"; do
        # shellcheck disable=SC2053 # glob match on purpose
        if [[ $c == $p ]]; then CASES+=("$c"); break; fi
    done
done
if [ "$LIST" = 1 ]; then
    for c in "${CASES[@]}"; do
        parse_case "$c"
        printf '%-26s guest: %-45s iwarp %s --set %s\n' "$c" "$(guest_cmd)" "$(iwarp_args)" "${SETS// / --set }"
    done
    exit 0
fi
[ ${#CASES[@]} -gt 0 ] || die "no case matches ${PATTERNS[*]} (see --list)"
[ "$(id -u)" = 0 ] || die "run as root (namespaces, taps, QEMU)"
[ -x "$RIG/run-peer.sh" ] || die "no rig at $RIG (set SIWVM_RIG)"
for t in tshark tcpdump qemu-system-x86_64 debootstrap flock; do
    command -v $t >/dev/null || die "missing $t (see deploy/interop/README.md for the packages)"
done

OUT=${OUT:-/var/tmp/iwarp-interop/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" || die "cannot make $OUT"
OUT=$(cd "$OUT" && pwd)
mkdir -p "$SIWVM_STATE"
exec 9>"$SIWVM_STATE/interop.lock"
flock -n 9 || die "another run holds $SIWVM_STATE/interop.lock"
T_START=$(date +%s)

# ---- teardown ----------------------------------------------------------------
HOST_PID=
CAP_FILE=
teardown() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$HOST_PID" ]; then
        kill "$HOST_PID" 2>/dev/null
        sleep 1
        kill -KILL "$HOST_PID" 2>/dev/null
    fi
    [ -n "$CAP_FILE" ] && "$RIG/run-peer.sh" cap-stop "$CAP_FILE" 2>/dev/null
    if [ -d "$VMDIR" ]; then
        cp -f "$VMDIR/console.log" "$OUT/guest-console.log" 2>/dev/null
        cp -f "$VMDIR/out.log" "$OUT/guest-out.log" 2>/dev/null
        cp -f "$VMDIR"/*.guest.log "$OUT/" 2>/dev/null
    fi
    "$RIG/run-peer.sh" stop "$VM" >/dev/null 2>&1
    "$RIG/run-peer.sh" down >/dev/null 2>&1
    rm -rf /var/run/dpdk/iwarp-interop-* 2>/dev/null
    log "torn down; results in $OUT"
    exit "$rc"
}
trap teardown EXIT
trap 'log "interrupted"; exit 130' INT TERM

# ---- image and binary ------------------------------------------------------------
log "guest image (build-image.sh; once per run)"
t0=$(date +%s)
"$RIG/build-image.sh" >"$OUT/build-image.log" 2>&1 || die "build-image.sh failed (see $OUT/build-image.log)"
log "image ready in $(( $(date +%s) - t0 )) s"
if [ -z "${IWARP_BIN:-}" ]; then
    log "cargo build --release -p dataplane --bin iwarp"
    (cd "$REPO" && cargo build --release -p dataplane --bin iwarp) >"$OUT/cargo-build.log" 2>&1 ||
        die "build failed (see $OUT/cargo-build.log)"
    IWARP_BIN=${CARGO_TARGET_DIR:-$REPO/target}/release/iwarp
fi
[ -x "$IWARP_BIN" ] || die "no iwarp binary at $IWARP_BIN"
"$IWARP_BIN" --help >/dev/null 2>&1 || die "$IWARP_BIN does not run"

# ---- guest script ----------------------------------------------------------------
# The guest runs every selected case in order. A server case starts the
# server, waits until its port listens, marks NAME.ready, and ends it when
# the host writes abort-NAME or after CASE_TMO; a client case waits for
# go-NAME (or abort-NAME) from the host. Exit codes land in NAME.rc.
GUEST_SCRIPT=$OUT/guest-cmd.sh
{
    cat <<EOF
# generated by deploy/interop/run-suite.sh
TMO=$CASE_TMO
EOF
    cat <<'EOF'
S=/host
now() { cut -d. -f1 /proc/uptime; }
listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q . ; }
server() { # NAME PORT CMD
    local n=$1 port=$2 cmd=$3 i=0 end
    echo "[$(now)] case $n: server: $cmd"
    bash -c "exec $cmd" >"$S/$n.guest.log" 2>&1 &
    local p=$!
    while ! listening "$port" && kill -0 $p 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
    touch "$S/$n.ready"
    end=$(( $(now) + TMO ))
    while kill -0 $p 2>/dev/null; do
        if [ -e "$S/abort-$n" ] || [ "$(now)" -ge $end ]; then
            echo "[$(now)] case $n: stopping the server"
            kill $p 2>/dev/null; sleep 1; kill -9 $p 2>/dev/null; break
        fi
        sleep 0.2
    done
    wait $p; local rc=$?
    echo "[$(now)] case $n: rc=$rc"
    echo $rc >"$S/$n.rc"
}
client() { # NAME CMD
    local n=$1 cmd=$2 end=$(( $(now) + TMO ))
    while [ ! -e "$S/go-$n" ] && [ ! -e "$S/abort-$n" ] && [ "$(now)" -lt $end ]; do sleep 0.2; done
    if [ ! -e "$S/go-$n" ]; then echo "[$(now)] case $n: no go"; echo 254 >"$S/$n.rc"; return; fi
    echo "[$(now)] case $n: client: $cmd"
    timeout -k 3 $TMO bash -c "exec $cmd" >"$S/$n.guest.log" 2>&1
    local rc=$?
    echo "[$(now)] case $n: rc=$rc"
    echo $rc >"$S/$n.rc"
}
EOF
    for c in "${CASES[@]}"; do
        parse_case "$c"
        if [ "$DIR" = to-siw ]; then
            echo "server $c $(port_of "$TEST") '$(guest_cmd)'"
        else
            echo "client $c '$(guest_cmd)'"
        fi
    done
} >"$GUEST_SCRIPT"
GUEST_TMO=$(( ${#CASES[@]} * (CASE_TMO + 40) + 60 ))

# ---- capture checks ----------------------------------------------------------------
TS=(tshark --disable-protocol rpcordma)
count() { "${TS[@]}" -r "$1" -Y "$2" -T fields -e frame.number 2>/dev/null | wc -l; }
# Sets FRAMES TCPSEGS MALFORMED BADCRC RETX RTO MPA_INFO and CAP_FAIL for $1.
check_capture() {
    local f=$1
    CAP_FAIL=
    FRAMES=$(count "$f" frame); TCPSEGS=$(count "$f" tcp)
    MALFORMED=$(count "$f" '_ws.malformed || _ws.expert.severity >= error')
    BADCRC=$("${TS[@]}" -r "$f" -V 2>/dev/null | grep -c 'Bad CRC32')
    RETX=$(count "$f" tcp.analysis.retransmission)
    RTO=$(count "$f" tcp.analysis.rto)
    # our MPA request(s) and siw's reply(s): src crc rej privatedata
    "${TS[@]}" -r "$f" -Y 'iwarp_mpa.req || iwarp_mpa.rep' -T fields -E separator=' ' \
        -e frame.number -e ip.src -e iwarp_mpa.crc_flag -e iwarp_mpa.rej_flag \
        -e iwarp_mpa.rev -e iwarp_mpa.privatedata >"${f%.pcap}.mpa.txt" 2>/dev/null
    local nreq nrep crc_on p2p
    nreq=$(awk -v ip=$DP_IP -v g=$GUEST_IP '($2==ip && DIR=="to-siw") || ($2==g && DIR=="from-siw")' DIR="$DIR" "${f%.pcap}.mpa.txt" | wc -l)
    nrep=$(( $(wc -l <"${f%.pcap}.mpa.txt") - nreq ))
    # CRC is on for a connection when request or reply has C set
    crc_on=$(awk '$3==1 || $3=="True" {c=1} END {print c+0}' "${f%.pcap}.mpa.txt")
    p2p=$(awk -v ip=$DP_IP '$2==ip && $6 ~ /^[89a-f]/ {p=1} END {print p+0}' "${f%.pcap}.mpa.txt")
    MPA_INFO="req=$nreq rep=$nrep crc=$crc_on p2p=$p2p"
    [ "$FRAMES" -gt 0 ] || CAP_FAIL+=" empty-capture"
    [ "$nreq" -gt 0 ] && [ "$nrep" -gt 0 ] || CAP_FAIL+=" no-MPA-exchange"
    [ "$MALFORMED" -eq 0 ] || CAP_FAIL+=" malformed=$MALFORMED"
    [ "$BADCRC" -eq 0 ] || CAP_FAIL+=" bad-crc=$BADCRC"
    if awk '$4==1 || $4=="True" {r=1} END {exit !r}' "${f%.pcap}.mpa.txt"; then CAP_FAIL+=" mpa-rejected"; fi
    if [ "$RETX_CHECK" = 1 ]; then
        [ "$RTO" -eq 0 ] || CAP_FAIL+=" rto=$RTO"
        [ $(( RETX * 1000 )) -lt "$TCPSEGS" ] || [ "$RETX" -eq 0 ] || CAP_FAIL+=" retx=$RETX/$TCPSEGS"
    fi
    [ "$EXP_CRC" = - ] || [ "$crc_on" = "$EXP_CRC" ] || CAP_FAIL+=" crc=$crc_on-expected-$EXP_CRC"
    [ "$EXP_P2P" = - ] || [ "$p2p" = "$EXP_P2P" ] || CAP_FAIL+=" p2p=$p2p-expected-$EXP_P2P"
}

# What the guest's log must show for a case to count as done.
guest_log_ok() {
    local f=$VMDIR/$1.guest.log
    if [ "$TEST" = rping ]; then
        [ "$(grep -c 'ping data' "$f" 2>/dev/null)" -ge "$RPING_C" ]
    else
        # perftest's result row: size, iterations, then figures
        grep -Eq '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$f" 2>/dev/null
    fi
}

vm_alive() { [ -e "$VMDIR/qemu.pid" ] && kill -0 "$(cat "$VMDIR/qemu.pid")" 2>/dev/null; }

# Waits up to $2 s for file $1 (while the guest lives).
wait_file() {
    local f=$1 i=0 n=$(( $2 * 5 ))
    while [ ! -e "$f" ] && [ $i -lt $n ]; do
        vm_alive || { [ -e "$f" ]; return; }
        sleep 0.2; i=$((i + 1))
    done
    [ -e "$f" ]
}

# Starts the iwarp tool in netns siwdp in the background: HOST_PID, log $1.
start_iwarp() {
    local logf=$1 c=$2 sets=() s
    for s in $SETS "idle.spin=$IDLE_SPIN" "idle.sleep_us=$IDLE_SLEEP_US"; do sets+=(--set "$s"); done
    # shellcheck disable=SC2046 # iwarp_args is a word list
    ip netns exec "$DP_NS" timeout -k 5 "$CASE_TMO" "$IWARP_BIN" $(iwarp_args) \
        --device "net_af_packet0,iface=$DP_IFACE" --ip "$DP_IP" --mac "$DP_MAC" \
        --eal "-l 0 --no-huge -m 256 --no-pci --no-telemetry --log-level=warning --file-prefix iwarp-interop-$c" \
        "${sets[@]}" >"$logf" 2>&1 </dev/null &
    HOST_PID=$!
}

# Waits for HOST_PID; sets HOST_RC.
wait_iwarp() {
    wait "$HOST_PID"; HOST_RC=$?
    HOST_PID=
    rm -rf "/var/run/dpdk/iwarp-interop-$1"
}

# ---- run ---------------------------------------------------------------------------
"$RIG/run-peer.sh" down >/dev/null 2>&1   # leftovers of an interrupted run
"$RIG/run-peer.sh" up 2>>"$OUT/run-peer.log" || die "run-peer.sh up failed"
log "${#CASES[@]} case(s); booting guest $VM ($GUEST_IP), guest timeout ${GUEST_TMO}s"
t0=$(date +%s)
"$RIG/run-peer.sh" start "$VM" "$GUEST_IP" "$(cat "$GUEST_SCRIPT")" "$GUEST_TMO" 2>>"$OUT/run-peer.log" ||
    die "guest did not start (see $OUT/run-peer.log)"
BOOT_S=$(( $(date +%s) - t0 ))
log "guest running its script after ${BOOT_S}s"

SUMMARY=$OUT/summary.txt
printf '%-26s %-6s %5s %7s %9s %7s %5s %4s  %-28s %s\n' case result secs frames malformed bad_crc retx rto mpa reason >"$SUMMARY"
FAILED=0; PASSED=0
for c in "${CASES[@]}"; do
    parse_case "$c"
    log "case $c"
    ct0=$(date +%s)
    REASON=
    pcap=$OUT/$c.pcap
    hostlog=$OUT/$c.iwarp.log
    HOST_RC=
    if [ "$DIR" = to-siw ]; then
        if ! wait_file "$VMDIR/$c.ready" 40; then
            REASON+=" guest-server-not-ready"
        else
            CAP_FILE=$pcap; "$RIG/run-peer.sh" cap-start "$TAP" "$pcap" 2>/dev/null
            start_iwarp "$hostlog" "$c"
            wait_iwarp "$c"
            # the server ends when the client disconnects: a few seconds
            # after a good run, at once after a failed one
            [ "$HOST_RC" = 0 ] || touch "$VMDIR/abort-$c"
            wait_file "$VMDIR/$c.rc" 15 || touch "$VMDIR/abort-$c"
        fi
    else
        CAP_FILE=$pcap; "$RIG/run-peer.sh" cap-start "$TAP" "$pcap" 2>/dev/null
        start_iwarp "$hostlog" "$c"
        # the tool listens once EAL and the port are up
        i=0
        while [ $i -lt 50 ] && kill -0 "$HOST_PID" 2>/dev/null &&
            ! grep -Eqi 'listen|waiting|ready' "$hostlog"; do sleep 0.2; i=$((i + 1)); done
        sleep 0.5
        if kill -0 "$HOST_PID" 2>/dev/null; then touch "$VMDIR/go-$c"; else touch "$VMDIR/abort-$c"; fi
        wait_iwarp "$c"
        wait_file "$VMDIR/$c.rc" 15 || touch "$VMDIR/abort-$c"
    fi
    wait_file "$VMDIR/$c.rc" 10
    GUEST_RC=$(cat "$VMDIR/$c.rc" 2>/dev/null || echo none)
    if [ -n "$CAP_FILE" ]; then "$RIG/run-peer.sh" cap-stop "$CAP_FILE" 2>/dev/null; CAP_FILE=; fi
    cp -f "$VMDIR/$c.guest.log" "$OUT/" 2>/dev/null
    [ "$HOST_RC" = 0 ] || REASON+=" iwarp-rc=${HOST_RC:-none}"
    [ "$GUEST_RC" = 0 ] || REASON+=" guest-rc=$GUEST_RC"
    [ "$GUEST_RC" = 0 ] && ! guest_log_ok "$c" && REASON+=" guest-output-incomplete"
    FRAMES=0 MALFORMED=0 BADCRC=0 RETX=0 RTO=0 MPA_INFO=-
    if [ -s "$pcap" ]; then
        check_capture "$pcap"
        REASON+=$CAP_FAIL
    else
        REASON+=" no-capture"
    fi
    secs=$(( $(date +%s) - ct0 ))
    if [ -z "$REASON" ]; then RESULT=PASS; PASSED=$((PASSED + 1)); else RESULT=FAIL; FAILED=$((FAILED + 1)); fi
    printf '%-26s %-6s %5s %7s %9s %7s %5s %4s  %-28s %s\n' "$c" $RESULT "$secs" "$FRAMES" "$MALFORMED" \
        "$BADCRC" "$RETX" "$RTO" "$MPA_INFO" "${REASON# }" >>"$SUMMARY"
    log "case $c: $RESULT (${secs}s)${REASON}"
    if ! vm_alive && [ "$c" != "${CASES[-1]}" ]; then
        log "guest is gone; the remaining cases fail"
    fi
done
"$RIG/run-peer.sh" wait "$VM" 60 >/dev/null 2>&1
TOTAL=$(( $(date +%s) - T_START ))
{
    echo
    echo "passed $PASSED, failed $FAILED of ${#CASES[@]}; guest boot ${BOOT_S}s; total ${TOTAL}s"
} >>"$SUMMARY"
cat "$SUMMARY"
[ "$FAILED" -eq 0 ]
