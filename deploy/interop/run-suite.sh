#!/usr/bin/env bash
# deploy/interop/run-suite.sh - interop suite against Linux soft-iWARP (siw).
#
# Boots a siw guest of the rig in deploy/interop/siw-vm (run-peer.sh)
# and runs, in that one boot (another if its kernel dies), rping and
# perftest (-R) cases in both roles
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
#   SIWVM_RIG      the rig's scripts (default: siw-vm/ next to this script,
#                  deploy/interop/siw-vm in the repository)
#   SIWVM_STATE    the rig's state (image, VM run dirs; default /var/tmp/siwvm)
#   IWARP_BIN      the iwarp binary (default: cargo build --release, then
#                  ${CARGO_TARGET_DIR:-<repo>/target}/release/iwarp)
#   CASE_TMO       seconds per case (default 60)
#   PERF_N         perftest iterations (default 200)
#   BW_SIZE LAT_SIZE  perftest message sizes (65536, 64)
#   RPING_C RPING_S   rping count and size (5, 100)
#   IDLE_SPIN IDLE_SLEEP_US  the dataplane's idle back-off (100, 200)
#   RETX_CHECK     0: do not check retransmissions/RTO (a lossy run)
#   RTO_MIN_S      a retransmission this long after the original is an RTO (0.2)
#   MAX_BOOTS      guest boots per attempt (5): a guest whose kernel died is
#                  booted again for the cases left
#   RETRIES        further attempts, each in a fresh guest, for the cases
#                  that failed (1; 0: none); such a case shows as PASS/2 or
#                  FAIL/2, and the run fails if any case failed every attempt
#   TAP_QLEN       txqueuelen of the guest's tap (10000): the TCG guest drains
#                  it slowly and the default 1000 overflows under a bulk send
#   CAP_SETTLE_S   pause before a capture is stopped (1.2 s: tcpdump's last
#                  packet block is retired after up to a second)
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
RIG=${SIWVM_RIG:-$HERE/siw-vm}
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
PACK_SIZE=${PACK_SIZE:-64}
LAT_SIZE=${LAT_SIZE:-64}
RPING_C=${RPING_C:-5}
RPING_S=${RPING_S:-100}
IDLE_SPIN=${IDLE_SPIN:-100}
IDLE_SLEEP_US=${IDLE_SLEEP_US:-200}
RETX_CHECK=${RETX_CHECK:-1}
RTO_MIN_S=${RTO_MIN_S:-0.2}
TAP_QLEN=${TAP_QLEN:-10000}
MAX_BOOTS=${MAX_BOOTS:-5}
RETRIES=${RETRIES:-1}
CAP_SETTLE_S=${CAP_SETTLE_S:-1.2}
OUT=

log() { echo "[interop $(date -u +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 2; }

# ---- the cases ---------------------------------------------------------------
# name = TEST-DIR-VARIANT. DIR: to-siw (siw serves, iwarp connects: our MPA
# request decides CRC and RTR) or from-siw (iwarp serves, siw connects).
# VARIANT (MPA options of our request / our reply):
#   crc        mpa.crc=true,  peer-to-peer with a write RTR (the defaults)
#   nocrc      mpa.crc=false, peer-to-peer with a write RTR
#   rtr-read   mpa.crc=true,  peer-to-peer with a read RTR
#   nop2p      mpa.crc=true,  mpa.rtr=none (no RTR: siw's responder can leave
#              our first FPDU unread, see README "Known problems")
#   crcreq     mpa.crc=required, peer-to-peer with a write RTR: to-siw, siw
#              honours our C and the case passes as any other; from-siw,
#              siw's request never sets C (its mpa_crc_required is a
#              compile-time false), so the case expects a refusal
#              (EXPECT=refused, see expect_refused)
#   tso        as crc, with our tool on DPDK's net_tap (bridged to the
#              segment in netns siwlab) instead of net_af_packet: the tap
#              grants TCP segmentation offload, so we hand it trains of
#              whole FPDUs to cut. The case also fails unless our counters
#              show trains, and unless every segment we sent in the
#              capture holds whole FPDUs only (one, or several small ones)
#   (crc and nocrc bandwidth cases in which we send the data, write_bw and
#   send_bw to siw, read_bw from siw: net_af_packet has no segmentation
#   offload, so our worker cuts the trains itself; these cases also fail
#   unless our counters show trains cut and every segment we sent in the
#   capture holds whole FPDUs only)
#   pack       as crc, with 64-byte messages in the bandwidth tests: more
#              small FPDUs queue than go out one by one, so several whole
#              ones share a segment (tcp.pack_fpdus). To siw, the case also
#              fails unless our counters show packed segments and unless
#              every data segment we sent holds whole FPDUs only, some
#              several; from siw, siw's own packed segments come to us
TESTS="rping write_bw read_bw send_bw write_lat read_lat send_lat"
all_cases() {
    local t
    for t in $TESTS; do echo "$t-to-siw-crc"; done
    for t in $TESTS; do echo "$t-to-siw-nocrc"; done
    for t in $TESTS; do echo "$t-from-siw-crc"; done
    for t in rping write_bw; do echo "$t-from-siw-nocrc"; done
    for t in rping write_bw; do echo "$t-to-siw-crcreq"; done
    echo "rping-from-siw-crcreq"
    for t in write_bw send_bw; do echo "$t-to-siw-pack"; done
    for t in write_bw send_bw; do echo "$t-from-siw-pack"; done
    # last: these can take the guest's kernel down (README, Known problems),
    # and the cases after one run in a new boot
    for t in rping write_bw; do echo "$t-to-siw-nop2p"; done
    for t in rping read_bw; do echo "$t-to-siw-rtr-read"; done
    for t in write_bw send_bw; do echo "$t-to-siw-tso"; done
    echo "read_bw-from-siw-tso"
}

# Sets TEST DIR VARIANT SETS EXP_CRC EXP_P2P EXPECT for case $1. EXPECT is
# "ok" (both sides exit 0, the MPA exchange accepts) or "refused" (our
# side refuses the connection with an MPA reject: see expect_refused).
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
        crc) SETS="mpa.crc=true mpa.rtr=write"; EXP_CRC=1; EXP_P2P=1 ;;
        nocrc) SETS="mpa.crc=false mpa.rtr=write"; EXP_CRC=0; EXP_P2P=1 ;;
        rtr-read) SETS="mpa.crc=true mpa.rtr=read"; EXP_CRC=1; EXP_P2P=1 ;;
        nop2p) SETS="mpa.crc=true mpa.rtr=none"; EXP_CRC=1; EXP_P2P=0 ;;
        crcreq) SETS="mpa.crc=required mpa.rtr=write"; EXP_CRC=1; EXP_P2P=1 ;;
        tso) SETS="mpa.crc=true mpa.rtr=write"; EXP_CRC=1; EXP_P2P=1 ;;
        pack) SETS="mpa.crc=true mpa.rtr=write tcp.pack_fpdus=true"; EXP_CRC=1; EXP_P2P=1 ;;
        *) return 1 ;;
    esac
    TSO=0 PACK=0 CUT=0
    [ "$VARIANT" = tso ] && TSO=1
    case "$VARIANT:$TEST-$DIR" in
        crc:write_bw-to-siw | crc:send_bw-to-siw | crc:read_bw-from-siw) CUT=1 ;;
        nocrc:write_bw-to-siw | nocrc:send_bw-to-siw) CUT=1 ;;
    esac
    [ "$VARIANT" = pack ] && PACK=1
    EXPECT=ok
    [ "$VARIANT" = crcreq ] && [ "$DIR" = from-siw ] && EXPECT=refused
    # as responder, the MPA flags are siw's request answered by our policy:
    # recorded, not asserted
    [ "$DIR" = from-siw ] && { EXP_CRC=-; EXP_P2P=-; }
    return 0
}

# What our log says, in one line, when we refuse a peer that did not ask
# for CRC (rdmap's RejectReason::CrcRequired).
REFUSAL_TEXT='the peer did not ask for MPA CRCs, and CRCs are required here'

# A refused case passes when both sides failed for the refusal: our tool
# ended on it (not at its timeout) and logged the reason in one line, and
# the guest's client failed to connect by itself (not stopped by the
# suite). Appends to REASON.
expect_refused() {
    local c=$1 hostlog=$2 n
    case "${HOST_RC:-none}" in
        0|124|137|none) REASON+=" iwarp-rc=${HOST_RC:-none}-expected-a-refusal" ;;
    esac
    case "$GUEST_RC" in
        0|254|143|137|none) REASON+=" guest-rc=$GUEST_RC-expected-a-refusal" ;;
    esac
    # rdma_cm hands the reject to the guest's client
    grep -q 'RDMA_CM_EVENT_REJECTED' "$VMDIR/$c.guest.log" 2>/dev/null || REASON+=" guest-saw-no-reject"
    n=$(grep -c -- "$REFUSAL_TEXT" "$hostlog" 2>/dev/null)
    [ "${n:-0}" = 1 ] || REASON+=" refusal-reason-lines=${n:-0}"
    # the reason is a sentence, not a debug value
    grep -- "$REFUSAL_TEXT" "$hostlog" 2>/dev/null | grep -q '[{}]\|::' && REASON+=" refusal-reason-not-a-sentence"
}

perf_size() {
    case "$1" in
        *_bw) if [ "${PACK:-0}" = 1 ]; then echo "$PACK_SIZE"; else echo "$BW_SIZE"; fi ;;
        *) echo "$LAT_SIZE" ;;
    esac
}
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
            echo "rping -s -a $DP_IP -C $RPING_C -S $RPING_S -V -d --wait $CASE_TMO"
        fi
    else
        local s; s=$(perf_size "$t")
        local peer=""
        [ "$DIR" = to-siw ] && peer=$GUEST_IP
        echo "perf ${t/_/-} $peer -R -F -n $PERF_N -s $s --timeout $(( CASE_TMO / 2 ))"
    fi
}

# ---- options -----------------------------------------------------------------
PATTERNS=()
LIST=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o) OUT=$2; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
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
        cp -f "$VMDIR"/*.guest.log "$VMDIR"/*.retries.log "$OUT/" 2>/dev/null
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
    log "cargo build --release -p iwarp"
    (cd "$REPO" && cargo build --release -p iwarp) >"$OUT/cargo-build.log" 2>&1 ||
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
# write_guest_script FILE CASE...
write_guest_script() {
local f=$1 c; shift
{
    cat <<EOF
# generated by deploy/interop/run-suite.sh
TMO=$CASE_TMO
EOF
    cat <<'EOF'
S=/host
CLOCK_MSG='Correlation coefficient'
now() { cut -d. -f1 /proc/uptime; }
# NAME.rc appears whole: the host takes the file's arrival as the case's
# end and reads it at once (written in place, it was once read empty).
put_rc() { echo "$2" >"$S/$1.rc.tmp" && mv -f "$S/$1.rc.tmp" "$S/$1.rc"; }
listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q . ; }
server() { # NAME PORT CMD
    local n=$1 port=$2 cmd=$3 i=0 end
    # the previous case's listener goes asynchronously (iw_cm)
    while listening "$port" && [ $i -lt 75 ]; do sleep 0.2; i=$((i + 1)); done
    local try p
    for try in 1 2 3; do
        i=0
        echo "[$(now)] case $n: server: $cmd"
        bash -c "exec $cmd" >"$S/$n.guest.log" 2>&1 &
        p=$!
        while ! listening "$port" && kill -0 $p 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
        # perftest's latency tests give up when timing the CPU clock is
        # too noisy (a loaded TCG guest): start again
        if ! kill -0 $p 2>/dev/null && grep -q "$CLOCK_MSG" "$S/$n.guest.log"; then
            wait $p; cat "$S/$n.guest.log" >>"$S/$n.retries.log"; continue
        fi
        break
    done
    sleep 0.5
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
    put_rc "$n" $rc
}
client() { # NAME CMD
    local n=$1 cmd=$2 end=$(( $(now) + TMO ))
    while [ ! -e "$S/go-$n" ] && [ ! -e "$S/abort-$n" ] && [ "$(now)" -lt $end ]; do sleep 0.2; done
    if [ ! -e "$S/go-$n" ]; then echo "[$(now)] case $n: no go"; put_rc "$n" 254; return; fi
    local try rc p
    for try in 1 2 3; do
        echo "[$(now)] case $n: client: $cmd"
        bash -c "exec $cmd" >"$S/$n.guest.log" 2>&1 &
        p=$!
        # ends with the command, at the host's abort (its side failed) or
        # at the case's timeout
        end=$(( $(now) + TMO ))
        while kill -0 $p 2>/dev/null; do
            if [ -e "$S/abort-$n" ] || [ "$(now)" -ge $end ]; then
                echo "[$(now)] case $n: stopping the client"
                kill $p 2>/dev/null; sleep 1; kill -9 $p 2>/dev/null; break
            fi
            sleep 0.2
        done
        wait $p; rc=$?
        [ $rc != 0 ] && grep -q "$CLOCK_MSG" "$S/$n.guest.log" || break
        cat "$S/$n.guest.log" >>"$S/$n.retries.log"
    done
    echo "[$(now)] case $n: rc=$rc"
    put_rc "$n" $rc
}
EOF
    for c in "$@"; do
        parse_case "$c"
        if [ "$DIR" = to-siw ]; then
            echo "server $c $(port_of "$TEST") '$(guest_cmd)'"
        else
            echo "client $c '$(guest_cmd)'"
        fi
    done
} >"$f"
}

# ---- capture checks ----------------------------------------------------------------
TS=(tshark --disable-protocol rpcordma)
# Sets FRAMES TCPSEGS MALFORMED BADCRC RETX RTO RST_AFTER_FIN MPA_INFO and CAP_FAIL for $1:
# one pass for the per-frame fields, a second over the MPA details for CRCs.
check_capture() {
    local f=$1 mpa=${1%.pcap}.mpa.txt fields=${1%.pcap}.fields.txt nreq nrep crc_on p2p
    CAP_FAIL=
    "${TS[@]}" -r "$f" -T fields -E separator='|' -E occurrence=a \
        -e frame.number -e ip.src -e tcp.srcport -e _ws.malformed -e _ws.expert.severity \
        -e tcp.analysis.retransmission -e tcp.analysis.fast_retransmission -e tcp.analysis.rto \
        -e iwarp_mpa.key.req -e iwarp_mpa.key.rep -e iwarp_mpa.crc_flag -e iwarp_mpa.rej_flag \
        -e iwarp_mpa.rev -e iwarp_mpa.privatedata \
        -e tcp.stream -e ip.dst -e tcp.seq -e tcp.len \
        -e tcp.options.sack.dsack_le -e tcp.options.sack.dsack_re >"$fields" 2>/dev/null
    # fields: 1 frame 2 src 3 sport 4 malformed 5 severities 6 retx 7 fast 8 rto
    #         9 mpa req 10 mpa rep 11 C 12 Rej 13 rev 14 private data
    #         15 stream 16 dst 17 seq 18 len 19 D-SACK left 20 D-SACK right
    # A retransmission that its receiver reports as a duplicate (D-SACK,
    # RFC 2883) repaired no loss (a late ACK, e.g. a descheduled peer): it
    # is counted apart as spurious, not against the run.
    read -r FRAMES TCPSEGS MALFORMED RETX RTO SPURIOUS < <(awk -F'|' -v rto_min="$RTO_MIN_S" '
        { frames++ }
        $3 != "" { tcp++ }
        { bad = ($4 != ""); n = split($5, sv, ","); for (i = 1; i <= n; i++) if (sv[i] + 0 >= 8388608) bad = 1; mal += bad }
        $19 != "" { n = split($19, l, ","); split($20, r, ","); for (i = 1; i <= n; i++) { k = ++nd; dst[k] = $15 "|" $2; dl[k] = l[i]; dr[k] = r[i] } }
        $6 != "" { rn++; rkey[rn] = $15 "|" $16; rs[rn] = $17; re[rn] = $17 + $18; rto_like[rn] = ($7 == "" && $8 + 0 >= rto_min) }
        END {
            for (j = 1; j <= rn; j++) {
                dup = 0
                for (k = 1; k <= nd; k++) if (dst[k] == rkey[j] && dl[k] <= rs[j] && dr[k] >= re[j]) { dup = 1; break }
                if (dup) spur++; else { retx++; rto += rto_like[j] }
            }
            printf "%d %d %d %d %d %d\n", frames, tcp, mal, retx, rto, spur
        }' "$fields")
    # MPA request/reply frames: number, source, C, Rej, revision, private data
    awk -F'|' '$9 != "" || $10 != "" { print $1, $2, $11, $12, $13, $14 }' "$fields" >"$mpa"
    rm -f "$fields"
    nreq=$(awk -v ip=$DP_IP -v g=$GUEST_IP -v dir="$DIR" '($2==ip && dir=="to-siw") || ($2==g && dir=="from-siw")' "$mpa" | wc -l)
    nrep=$(( $(wc -l <"$mpa") - nreq ))
    # CRC is on for a connection when request or reply has C set
    crc_on=$(awk '$3==1 || $3=="True" {c=1} END {print c+0}' "$mpa")
    p2p=$(awk -v ip=$DP_IP '$2==ip && $6 ~ /^[89a-f]/ {p=1} END {print p+0}' "$mpa")
    BADCRC=0
    if [ "$crc_on" = 1 ]; then
        BADCRC=$("${TS[@]}" -r "$f" -Y iwarp_mpa -O iwarp_mpa 2>/dev/null | grep -c 'Bad CRC32')
    fi
    MPA_INFO="req=$nreq rep=$nrep crc=$crc_on p2p=$p2p"
    [ "$SPURIOUS" = 0 ] || NOTE+=" ($SPURIOUS spurious retransmission(s), D-SACKed)"
    [ "$FRAMES" -gt 0 ] || CAP_FAIL+=" empty-capture"
    [ "$nreq" -gt 0 ] && [ "$nrep" -gt 0 ] || CAP_FAIL+=" no-MPA-exchange"
    [ "$MALFORMED" -eq 0 ] || CAP_FAIL+=" malformed=$MALFORMED"
    [ "$BADCRC" -eq 0 ] || CAP_FAIL+=" bad-crc=$BADCRC"
    # An orderly close ends in FINs only: a RST of ours on a connection
    # where we had sent a FIN means we gave up on the close (hardware
    # peers log it as an error).
    RST_AFTER_FIN=$("${TS[@]}" -r "$f" -Y 'tcp.flags.fin == 1 || tcp.flags.reset == 1' \
        -T fields -E separator='|' -e tcp.stream -e ip.src -e tcp.flags.fin -e tcp.flags.reset 2>/dev/null |
        awk -F'|' -v ip=$DP_IP '$2 == ip && ($3 == 1 || $3 == "True") { fin[$1] = 1 }
            $2 == ip && ($4 == 1 || $4 == "True") && fin[$1] { n++ } END { print n + 0 }')
    [ "$RST_AFTER_FIN" -eq 0 ] || CAP_FAIL+=" rst-after-our-fin=$RST_AFTER_FIN"
    if awk '$4==1 || $4=="True" {r=1} END {exit !r}' "$mpa"; then
        [ "$EXPECT" = refused ] || CAP_FAIL+=" mpa-rejected"
    else
        [ "$EXPECT" = refused ] && CAP_FAIL+=" mpa-not-rejected"
    fi
    # a refused case: the guest's request without C, our reply with R
    if [ "$EXPECT" = refused ] &&
        ! awk -v g=$GUEST_IP '$2==g && ($3==1 || $3=="True") {c=1} END {exit c}' "$mpa"; then
        CAP_FAIL+=" guest-request-asked-for-crc"
    fi
    if [ "$TSO" = 1 ] || [ "$CUT" = 1 ] || { [ "$PACK" = 1 ] && [ "$DIR" = to-siw ]; }; then
        # every data segment we sent after the MPA exchange: whole FPDUs
        # only, each its length field, ULPDU, pad to 4 and CRC field (there,
        # zero, with CRCs off too), adding up to the TCP length. A train
        # (tso, cut by the port, or one the worker cut) cut off an FPDU
        # boundary fails; a segment may still pack several small ones (a
        # message's short last FPDU and the next one's first, say), and in
        # the pack cases some must. Retransmissions are left out: tshark
        # does not dissect their payload again.
        read -r OURSEGS MISFIT PACKED < <("${TS[@]}" -r "$f" -T fields -E separator='|' -E occurrence=a \
            -Y "ip.src == $DP_IP && tcp.len > 0 && !iwarp_mpa.req && !iwarp_mpa.rep && !tcp.analysis.retransmission" \
            -e tcp.len -e iwarp_mpa.ulpdulength 2>/dev/null |
            awk -F'|' '{ n++; k = split($2, u, ","); t = 0
                for (i = 1; i <= k; i++) t += int((u[i] + 2 + 3) / 4) * 4 + 4
                if (k == 0 || $1 != t) bad++; if (k > 1) packed++ }
                END { printf "%d %d %d\n", n, bad, packed }')
        if [ "${OURSEGS:-0}" = 0 ]; then
            CAP_FAIL+=" no-data-segments-of-ours"
        elif [ "${MISFIT:-1}" != 0 ]; then
            CAP_FAIL+=" segments-not-whole-fpdus=$MISFIT/$OURSEGS"
        elif [ "$PACK" = 1 ] && [ "${PACKED:-0}" = 0 ]; then
            CAP_FAIL+=" no-packed-segments-in-capture"
        else
            NOTE+=" ($OURSEGS segments of ours, whole FPDUs only, ${PACKED:-0} with several)"
        fi
    fi
    if [ "$RETX_CHECK" = 1 ] && [ "$DROPS" = 0 ]; then
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
    elif [ "$TEST" = read_lat ] && [ "$DIR" = to-siw ]; then
        # the passive side of a read latency test measures nothing
        grep -q -- '--------' "$f" 2>/dev/null
    else
        # perftest's result row: size, iterations, then figures (a latency
        # server under TCG may print inf: its cycle counter's rate is unknown)
        grep -Eq '^ *[0-9]+ +[0-9]+ +([0-9.]+|inf) ' "$f" 2>/dev/null
    fi
}

# ---- perftest's printed lines ----------------------------------------------------
# Our perf output is meant to diff against a host's perftest by the figures
# alone. perftest_lines FILE: the lines perftest prints on stdout (they all
# start with a space or a dash; our stderr and EAL's lines do not), in a
# form both roles share: values that must differ masked (addresses, QPN,
# PSN, RKey, VAddr, GID digits, figures with the padding their widths
# decide (a last figure's padding trails the line), the device and what it decides: PCIe relaxed ordering,
# outstanding reads), lines only one role prints
# dropped (the server's banner and rdma_cm waiting lines, the client's TX
# depth, a send server's RX depth, and the read latency table, which only
# the client prints), runs of rules left by that squeezed to one.
perftest_lines() {
    grep -a '^[ -]' "$1" 2>/dev/null |
        sed -e 's/\r$//' \
            -e '/^ TX depth  *:/d' -e '/^ RX depth  *:/d' \
            -e '/^ Waiting for client rdma_cm QP to connect$/d' \
            -e '/^ Please run the same command with the IB\/RoCE interface IP$/d' \
            -e 's/\(Device  *: \).*/\1<device>/' \
            -e 's/^\( PCIe relax order: \).*/\1<pcie>/' \
            -e 's/^\( Outstand reads  : \).*/\1<reads>/' \
            -e '/ address: /s/\(LID\|QPN\|PSN\|OUT\|RKey\|VAddr\) [0-9a-fA-Fx]*/\1 <v>/g' \
            -e '/^ GID: /s/[0-9][0-9]*/N/g' \
            -e '/^ [0-9]/{s/-\{0,1\}\(inf\|nan\|[0-9][0-9.]*\)/#/g; s/ *\t/\t/g; s/  */ /g; s/ *$//}' |
        if [ "$TEST" = read_lat ]; then grep -v '^ #bytes\|^ [#0-9]'; else cat; fi |
        uniq
}

# Compares our perftest lines ($2, our log) with the guest's of case $1:
# the same lines in the same order, else the case fails with the number
# of differing lines (the diff lands in OUT/CASE.lines.diff). Appends to
# REASON or NOTE.
compare_perftest_lines() {
    local c=$1 ours=$OUT/$1.lines.iwarp theirs=$OUT/$1.lines.guest n
    perftest_lines "$2" >"$ours"
    perftest_lines "$VMDIR/$c.guest.log" >"$theirs"
    if [ ! -s "$ours" ] || [ ! -s "$theirs" ]; then
        REASON+=" perftest-lines-missing(iwarp=$(wc -l <"$ours"),guest=$(wc -l <"$theirs"))"
    elif diff -u --label "guest $c" --label "iwarp $c" "$theirs" "$ours" >"$OUT/$c.lines.diff"; then
        NOTE+=" (perftest lines: $(wc -l <"$ours") as the guest's)"
        rm -f "$OUT/$c.lines.diff"
    else
        n=$(grep -c '^[-+][^-+]' "$OUT/$c.lines.diff")
        REASON+=" perftest-lines-differ=$n($c.lines.diff)"
        log "case $c: our perftest lines differ from the guest's:"
        sed 's/^/    /' "$OUT/$c.lines.diff" >&2
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

# The tso variant's port: DPDK's net_tap, whose kernel side joins br0 in
# netns siwlab (under another MAC: a bridge keeps frames to one of its
# ports' own MAC for itself) once the tool has created it.
DP_TAP=dptap0
DP_TAP_KMAC=02:00:00:77:00:fd
bridge_dp_tap() {
    local i=0
    while ! ip -n siwlab link show "$DP_TAP" >/dev/null 2>&1; do
        [ $i -lt 100 ] || return 1
        sleep 0.1; i=$((i + 1))
    done
    ip -n siwlab link set "$DP_TAP" address "$DP_TAP_KMAC"
    # checksums complete on frames handed to the port
    ip netns exec siwlab ethtool -K "$DP_TAP" tx off >/dev/null 2>&1
    ip -n siwlab link set "$DP_TAP" master br0 up
    # the bridge learnt our MAC on veth-d in an earlier case
    bridge -n siwlab fdb del "$DP_MAC" dev veth-d master 2>/dev/null
    return 0
}

# Starts the iwarp tool in the background (netns siwdp on net_af_packet;
# the tso variant in netns siwlab on net_tap): HOST_PID, log $1.
start_iwarp() {
    local logf=$1 c=$2 sets=() s ns=$DP_NS dev="net_af_packet0,iface=$DP_IFACE" extra=()
    for s in $SETS "idle.spin=$IDLE_SPIN" "idle.sleep_us=$IDLE_SLEEP_US"; do sets+=(--set "$s"); done
    if [ "$TSO" = 1 ]; then
        ns=siwlab dev="net_tap0,iface=$DP_TAP"
        bridge_dp_tap &
    fi
    if [ "$TSO" = 1 ] || [ "$PACK" = 1 ] || [ "$CUT" = 1 ]; then
        extra=(--counters "$OUT/$c.counters.json")
        rm -f "$OUT/$c.counters.json"
    fi
    # The log exists before the tool starts: the caller may look into it
    # before the background job has opened it.
    : >"$logf"
    # shellcheck disable=SC2046 # iwarp_args is a word list
    ip netns exec "$ns" timeout -k 5 "$CASE_TMO" "$IWARP_BIN" $(iwarp_args) "${extra[@]}" \
        --device "$dev" --ip "$DP_IP" --mac "$DP_MAC" \
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

# frames the segment dropped (the tap's queue to the guest, the veths)
seg_drops() {
    local a b c
    a=$(ip netns exec siwlab cat "/sys/class/net/$TAP/statistics/tx_dropped" 2>/dev/null || echo 0)
    b=$(ip netns exec siwlab cat /sys/class/net/veth-d/statistics/tx_dropped 2>/dev/null || echo 0)
    c=$(ip netns exec "$DP_NS" cat "/sys/class/net/$DP_IFACE/statistics/rx_dropped" 2>/dev/null || echo 0)
    echo $(( a + b + c ))
}

# Counter $1 from our counters of case $2 (empty without them).
counter() {
    grep -o "\"$1\":[0-9]*" "$OUT/$2.counters.json" 2>/dev/null | cut -d: -f2
}

# The guest's kernel has died (an iw_cm BUG takes the RDMA stack with it).
guest_broken() {
    # Up to the guest's power-off only: once it has asked for it, its disk
    # goes away under its init, whose exit then panics the kernel with
    # every case already over ("Attempted to kill init").
    sed '/\[siw-init\] powering off/q' "$VMDIR/console.log" 2>/dev/null |
        grep -Eq 'kernel BUG|Oops|general protection fault|Kernel panic'
}

# Runs case $1 against the running guest; appends its row to the summary.
run_case() {
    local c=$1 ct0 drops0 pcap hostlog i secs
    parse_case "$c"
    log "case $c"
    ct0=$(date +%s)
    drops0=$(seg_drops)
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
        # the guest's client ends with our server: a few seconds after a
        # good run, at once after a failed one (a refused client is left to
        # fail by itself)
        [ "$HOST_RC" = 0 ] || [ "$EXPECT" = refused ] || touch "$VMDIR/abort-$c"
        wait_file "$VMDIR/$c.rc" 15 || touch "$VMDIR/abort-$c"
    fi
    wait_file "$VMDIR/$c.rc" 10
    GUEST_RC=$(cat "$VMDIR/$c.rc" 2>/dev/null || echo none)
    # tcpdump gets the kernel's packets in blocks retired after up to 1 s:
    # let the last one retire before the capture is stopped
    sleep "$CAP_SETTLE_S"
    if [ -n "$CAP_FILE" ]; then "$RIG/run-peer.sh" cap-stop "$CAP_FILE" 2>/dev/null; CAP_FILE=; fi
    cp -f "$VMDIR/$c.guest.log" "$VMDIR/$c.retries.log" "$OUT/" 2>/dev/null
    if [ "$EXPECT" = refused ]; then
        expect_refused "$c" "$hostlog"
    else
        [ "$HOST_RC" = 0 ] || REASON+=" iwarp-rc=${HOST_RC:-none}"
        [ "$GUEST_RC" = 0 ] || REASON+=" guest-rc=$GUEST_RC"
        [ "$GUEST_RC" = 0 ] && ! guest_log_ok "$c" && REASON+=" guest-output-incomplete"
    fi
    guest_broken && REASON+=" guest-kernel-crashed"
    FRAMES=0 MALFORMED=0 BADCRC=0 RETX=0 RTO=0 MPA_INFO=- NOTE=
    DROPS=$(( $(seg_drops) - drops0 ))
    if [ -s "$pcap" ]; then
        check_capture "$pcap"
        REASON+=$CAP_FAIL
    else
        REASON+=" no-capture"
    fi
    [ "$DROPS" = 0 ] || NOTE+=" (segment dropped $DROPS frames: retransmission check skipped)"
    if [ "$TSO" = 1 ]; then
        # the port cut trains: our counters say how many
        local trains cut
        trains=$(counter tx_tso_frames "$c")
        cut=$(counter tx_tso_segments "$c")
        if [ -z "$trains" ]; then
            REASON+=" no-counters"
        elif [ "$trains" = 0 ] || [ "$cut" -lt $(( 2 * trains )) ]; then
            REASON+=" no-trains($trains,$cut)"
        else
            NOTE+=" ($trains trains cut into $cut segments)"
        fi
    fi
    if [ "$CUT" = 1 ]; then
        # trains our worker cut itself: our counters say how many
        local cuts
        cuts=$(counter tx_cut_trains "$c")
        if [ -z "$cuts" ]; then
            REASON+=" no-counters"
        elif [ "$cuts" = 0 ]; then
            REASON+=" no-cut-trains"
        else
            NOTE+=" ($cuts trains cut by the worker)"
        fi
    fi
    if [ "$PACK" = 1 ] && [ "$DIR" = to-siw ]; then
        # several whole FPDUs per segment: our counters say how many
        local psegs pfpdus
        psegs=$(counter tx_packed_segments "$c")
        pfpdus=$(counter tx_packed_fpdus "$c")
        if [ -z "$psegs" ]; then
            REASON+=" no-counters"
        elif [ "$psegs" = 0 ] || [ "$pfpdus" -lt $(( 2 * psegs )) ]; then
            REASON+=" no-packs($psegs,$pfpdus)"
        else
            NOTE+=" ($psegs segments carried $pfpdus FPDUs)"
        fi
    fi
    if [ "$TEST" != rping ] && [ "${EXPECT:-ok}" = ok ] && [ "$HOST_RC" = 0 ] && [ "$GUEST_RC" = 0 ]; then
        compare_perftest_lines "$c" "$hostlog"
    fi
    secs=$(( $(date +%s) - ct0 ))
    if [ -z "$REASON" ]; then
        RESULT=PASS; PASSED=$((PASSED + 1))
    else
        RESULT=FAIL; FAILED=$((FAILED + 1)); FAILED_CASES+=("$c")
    fi
    # a second attempt is marked in the table: PASS/2 is a case that
    # failed once and passed when run again
    [ "$ATTEMPT" -gt 1 ] && RESULT+="/$ATTEMPT"
    printf '%-26s %-6s %5s %7s %9s %7s %5s %4s %5s  %-28s %s\n' "$c" $RESULT "$secs" "$FRAMES" "$MALFORMED" \
        "$BADCRC" "$RETX" "$RTO" "$DROPS" "$MPA_INFO" "${REASON# }$NOTE" >>"$SUMMARY"
    log "case $c: $RESULT (${secs}s)${REASON}${NOTE}"
}

# One guest boot for cases "$@"; REMAINING: the cases left when the guest
# died (they get a new boot).
run_boot() {
    local n=$1 t0 boot_s k; shift
    local script=$OUT/guest-cmd.$n.sh tmo=$(( $# * (CASE_TMO + 40) + 60 ))
    write_guest_script "$script" "$@"
    log "boot $n: $# case(s); guest $VM ($GUEST_IP), guest timeout ${tmo}s"
    t0=$(date +%s)
    REMAINING=()
    if ! "$RIG/run-peer.sh" start "$VM" "$GUEST_IP" "$(cat "$script")" "$tmo" 2>>"$OUT/run-peer.log"; then
        log "guest did not start (see $OUT/run-peer.log)"
        REMAINING=("$@")
        return
    fi
    boot_s=$(( $(date +%s) - t0 ))
    BOOTS+=" ${boot_s}s"
    ip -n siwlab link set "$TAP" txqueuelen "$TAP_QLEN" 2>/dev/null || log "cannot set txqueuelen of $TAP"
    log "guest running its script after ${boot_s}s"
    local args=("$@")
    for ((k = 0; k < ${#args[@]}; k++)); do
        run_case "${args[$k]}"
        if guest_broken || ! vm_alive; then
            REMAINING=("${args[@]:k+1}")
            [ ${#REMAINING[@]} -gt 0 ] && log "the guest died (see guest-console.$n.log); ${#REMAINING[@]} case(s) left"
            break
        fi
    done
    "$RIG/run-peer.sh" wait "$VM" 30 >/dev/null 2>&1 || "$RIG/run-peer.sh" stop "$VM" >/dev/null 2>&1
    cp -f "$VMDIR/console.log" "$OUT/guest-console.$n.log" 2>/dev/null
    cp -f "$VMDIR/out.log" "$OUT/guest-out.$n.log" 2>/dev/null
}

# ---- run ---------------------------------------------------------------------------
"$RIG/run-peer.sh" down >/dev/null 2>&1   # leftovers of an interrupted run
"$RIG/run-peer.sh" up 2>>"$OUT/run-peer.log" || die "run-peer.sh up failed"
SUMMARY=$OUT/summary.txt
printf '%-26s %-6s %5s %7s %9s %7s %5s %4s %5s  %-28s %s\n' case result secs frames malformed bad_crc retx rto drops mpa reason >"$SUMMARY"
FAILED=0; PASSED=0; BOOTS=; BOOT_N=0; FAILED_CASES=(); RETRIED=0
# One attempt at cases "$@": boots until every case has run (a guest
# whose kernel died is booted again for the cases left).
run_attempt() {
    local todo=("$@") b
    for b in $(seq 1 "$MAX_BOOTS"); do
        BOOT_N=$((BOOT_N + 1))
        run_boot "$BOOT_N" "${todo[@]}"
        todo=("${REMAINING[@]}")
        [ ${#todo[@]} -gt 0 ] || break
    done
    for c in "${todo[@]}"; do
        printf '%-26s %-6s %5s %7s %9s %7s %5s %4s %5s  %-28s %s\n' "$c" FAIL 0 - - - - - - - "not run: guest died $MAX_BOOTS times" >>"$SUMMARY"
        FAILED=$((FAILED + 1)); FAILED_CASES+=("$c")
    done
}
ATTEMPT=1
run_attempt "${CASES[@]}"
# RETRIES more attempts, each in a fresh guest, for the cases that failed:
# the guest runs under TCG on a shared host, where a late ACK or a slow
# boot can fail a case once; a case that fails every attempt fails the
# run. The first attempt's files are kept as CASE.attempt1.*.
while [ ${#FAILED_CASES[@]} -gt 0 ] && [ "$ATTEMPT" -le "$RETRIES" ]; do
    ATTEMPT=$((ATTEMPT + 1))
    again=("${FAILED_CASES[@]}"); FAILED_CASES=()
    FAILED=$((FAILED - ${#again[@]})); RETRIED=$((RETRIED + ${#again[@]}))
    for c in "${again[@]}"; do
        for f in "$OUT/$c".*; do
            [ -e "$f" ] || continue
            case "$f" in *.attempt*) continue ;; esac
            mv -f "$f" "$OUT/$c.attempt$((ATTEMPT - 1)).${f#"$OUT/$c".}"
        done
    done
    log "attempt $ATTEMPT for ${#again[@]} failed case(s): ${again[*]}"
    run_attempt "${again[@]}"
done
TOTAL=$(( $(date +%s) - T_START ))
{
    echo
    echo "passed $PASSED, failed $FAILED of ${#CASES[@]} ($RETRIED run again after a failure); guest boots:$BOOTS; total ${TOTAL}s"
} >>"$SUMMARY"
cat "$SUMMARY"
[ "$FAILED" -eq 0 ]
