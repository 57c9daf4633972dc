#!/usr/bin/env bash
# A real Slurm on this machine: munge, MariaDB, slurmdbd, slurmctld and one or more slurmd.
#
#   slurm/cluster/cluster.sh up      # install what is missing (apt, needs root), start, wait for the nodes
#   slurm/cluster/cluster.sh down    # stop every daemon it started (by the pids it recorded), remove
#                                    # the namespaces and links it made (also after a crash)
#   slurm/cluster/cluster.sh status  # exit 0 when the controller answers
#   slurm/cluster/cluster.sh env     # the lines to export, e.g. eval "$(slurm/cluster/cluster.sh env)"
#
# Two shapes (CSRUN_SLURM_NODES, `make cluster-up NODES=N`):
# - unset or 0: one host on loopback, the node named after this host, the CS system a count-1
#   GRES `cs` on it (the quick tiers' cluster; jobs may reach an embedded simulator on loopback).
# - N >= 1: N compute hosts node1..nodeN, each a network namespace with its own address on a
#   bridge this script creates (a private /24, 10.216.<port base/100>.0 unless
#   CSRUN_SLURM_SUBNET names another first three octets), plus a host `cs` (its own namespace
#   and address) where the CS system runs as a service (`wse_sim serve` bound to its bridge
#   address, its port N+20). slurmctld and slurmdbd listen on the bridge's address in this
#   namespace (.1); each slurmd is started in its namespace with `nsenter --net=...`
#   (`ip netns exec` remounts /sys and slurmd then finds no cgroup fs). The CS system is a
#   cluster license `cs:1` (one CS for the whole cluster: any node's job may hold it; a GRES
#   would have to sit on every node of a multi-node job). Addresses exist only on that
#   bridge and in the namespaces made here; nothing is routed off the machine.
#
# Everything (configs, state, spool, logs, pids, sockets, the database) lives under one folder,
# $CSRUN_SLURM_DIR (default /tmp/csrun-slurm). The Slurm commands find this cluster through
# SLURM_CONF=$CSRUN_SLURM_DIR/etc/slurm.conf: nothing is written to /etc, so the machine's
# other users (and csrun's local-backend tests) do not see it unless they export SLURM_CONF.
# `up` is idempotent: daemons already running are reused; a cluster of another shape is an
# error (down first). Ports: slurmctld N+17, slurmd N+18, slurmdbd N+19, MariaDB N+6 (loopback),
# the CS system N+20, with N=CSRUN_SLURM_PORT_BASE (default 16800).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${CSRUN_SLURM_DIR:-/tmp/csrun-slurm}"
BASE="${CSRUN_SLURM_PORT_BASE:-16800}"
CTLD_PORT=$((BASE + 17)) SLURMD_PORT=$((BASE + 18)) DBD_PORT=$((BASE + 19)) DB_PORT=$((BASE + 6))
CS_PORT=$((BASE + 20))
NODE="$(hostname -s)"
CPUS="${CSRUN_SLURM_CPUS:-8}"          # declared, more than the machine has (config_overrides)
PARTITION="${CSRUN_SLURM_PARTITION:-csrun}"
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge)
export SLURM_CONF="$DIR/etc/slurm.conf"
# Several hosts: names of what this script makes, all derived from the port base (so two
# clusters of different bases never touch each other's), and their addresses.
NODES="${CSRUN_SLURM_NODES:-0}"
PREFIX="csr$BASE"                      # namespaces csr16800-node1.., csr16800-cs; links csr16800*
BRIDGE="${PREFIX}br"
SUBNET="${CSRUN_SLURM_SUBNET:-10.216.$(((BASE / 100) % 256))}"
CTLD_ADDR=127.0.0.1
CS_ADDR="$SUBNET.2"
PYTHON="${CSRUN_PYTHON:-$HERE/../../.venv/bin/python}"  # runs the CS service (wse_sim serve)

say() { echo "cluster: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }

pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local seconds=$1 what=$2; shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what did not come up within ${seconds} s (hint: see $DIR/log/)"
        sleep 0.5
    done
}

node_names() {  # the Slurm nodes of this shape
    if ((NODES == 0)); then echo "$NODE"; else for i in $(seq "$NODES"); do echo "node$i"; done; fi
}
node_addr() { echo "$SUBNET.$((10 + ${1#node}))"; }  # node_addr nodeI
netns_of() { echo "$PREFIX-$1"; }                    # netns_of nodeI|cs

install_packages() {
    local missing=()
    for bin in slurmctld slurmd slurmdbd sacctmgr munged mariadbd mariadb-install-db; do
        command -v "$bin" >/dev/null || missing+=("$bin")
    done
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "missing ${missing[*]} and not root (hint: apt-get install ${PACKAGES[*]} as root)"
    say "installing ${PACKAGES[*]}"
    apt-get update -q >"$DIR/log/apt.log" 2>&1 || die "apt-get update failed (hint: see $DIR/log/apt.log)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
        >>"$DIR/log/apt.log" 2>&1 || die "apt-get install failed (hint: see $DIR/log/apt.log)"
}

render() {  # render TEMPLATE OUT MODE
    sed -e "s|@DIR@|$DIR|g" -e "s|@NODE@|$NODE|g" -e "s|@CPUS@|$CPUS|g" -e "s|@PARTITION@|$PARTITION|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" \
        -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DB_PASS@|$(cat "$DIR/etc/db_pass")|g" \
        -e "s|@CTLD_ADDR@|$CTLD_ADDR|g" \
        -e "s|@MEM_MB@|${CSRUN_SLURM_MEM_MB:-4096}|g" "$HERE/$1" >"$2.tmp"
    chmod "$3" "$2.tmp"
    mv "$2.tmp" "$2"
}

node_lines() {  # the nodes, the partition and the CS system, for slurm.conf
    local mem="${CSRUN_SLURM_MEM_MB:-4096}"
    echo "GresTypes=cs"
    if ((NODES == 0)); then
        echo "# The CS system: a count-1 GRES on the one node, so two jobs never share it."
        echo "NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem Gres=cs:1 State=UNKNOWN"
        echo "PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
        echo "# Batch jobs may be requeued (csrun_wse --requeue: scontrol requeue, a preemption); a"
        echo "# stopped chief has KillWait seconds between SIGTERM and SIGKILL for its last checkpoint."
        echo "JobRequeue=1"
        echo "KillWait=15"
        return
    fi
    echo "# $NODES hosts on the bridge $BRIDGE ($SUBNET.0/24); the CS system at $CS_ADDR:$CS_PORT is"
    echo "# one cluster license: a job asks --licenses=cs:1 from any node; two jobs never share it."
    echo "Licenses=cs:1"
    echo "# A host that stops answering is DOWN within ~SlurmdTimeout; its job ends NODE_FAIL, not requeued."
    echo "SlurmdTimeout=15"
    echo "JobRequeue=0"
    echo "KillWait=5"
    for n in $(node_names); do
        echo "NodeName=$n NodeAddr=$(node_addr "$n") CPUs=$CPUS RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
}

configure() {
    mkdir -p "$DIR"/{etc,state,spool,log,run}
    chmod 755 "$DIR"
    [[ -s "$DIR/etc/db_pass" ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/etc/db_pass")
    render slurm.conf.in "$DIR/etc/slurm.conf" 644
    node_lines >>"$DIR/etc/slurm.conf"
    if ((NODES == 0)); then render gres.conf.in "$DIR/etc/gres.conf" 644; else : >"$DIR/etc/gres.conf"; fi
    render slurmdbd.conf.in "$DIR/etc/slurmdbd.conf" 600  # slurmdbd reads it next to $SLURM_CONF
    echo "$NODES" >"$DIR/etc/nodes"
}

make_network() {  # the bridge (controller .1), a namespace per host with its veth into the bridge
    [[ $(id -u) == 0 ]] || die "hosts as network namespaces need root (hint: run as root, or NODES=0)"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge || die "cannot create the bridge $BRIDGE (hint: needs CAP_NET_ADMIN)"
    fi
    ip addr replace "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local host ns addr veth
    for host in $(node_names) cs; do
        ns="$(netns_of "$host")"
        addr="$CS_ADDR"; [[ $host == cs ]] || addr="$(node_addr "$host")"
        veth="${PREFIX}v${host#node}"
        [[ -e /run/netns/$ns ]] || ip netns add "$ns" || die "cannot create the network namespace $ns"
        if ! ip link show "$veth" >/dev/null 2>&1; then
            ip link add "$veth" type veth peer name eth0 netns "$ns" || die "cannot create the link $veth into $ns"
        fi
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" addr replace "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

start_munge() {
    local m="$DIR/munge"
    pid_alive "$m/munged.pid" && return 0
    mkdir -p "$m"
    [[ -s "$m/munge.key" ]] || mungekey --create --keyfile="$m/munge.key" --force
    chown -R munge:munge "$m"
    chmod 700 "$m"
    chmod 600 "$m/munge.key"
    runuser -u munge -- munged --socket="$m/munge.socket" --key-file="$m/munge.key" \
        --pid-file="$m/munged.pid" --log-file="$m/munged.log" --seed-file="$m/munged.seed" --force
    wait_for 20 munged test -S "$m/munge.socket"
    # slurm's tools (running as root or the user) need to reach the socket
    chmod 755 "$m"
}

start_mariadb() {
    local d="$DIR/mysql"
    pid_alive "$d/mariadbd.pid" && return 0
    mkdir -p "$d"
    chown mysql:mysql "$d"  # mariadb wants its socket dir writable by mysql
    if [[ ! -d "$d/data/mysql" ]]; then
        mariadb-install-db --user=mysql --datadir="$d/data" --auth-root-authentication-method=socket \
            --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 \
            || die "mariadb-install-db failed (hint: see $DIR/log/mariadb-install.log)"
    fi
    mariadbd --no-defaults --user=mysql --datadir="$d/data" --socket="$d/mariadbd.sock" \
        --pid-file="$d/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --log-error="$d/mariadb.log" --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
    wait_for 60 MariaDB mariadb --no-defaults -S "$d/mariadbd.sock" -u root -e "select 1"
    local pass
    pass="$(cat "$DIR/etc/db_pass")"
    mariadb --no-defaults -S "$d/mariadbd.sock" -u root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

start_slurmdbd() {
    pid_alive "$DIR/run/slurmdbd.pid" && return 0
    slurmdbd
    wait_for 60 slurmdbd sacctmgr -n list cluster
    sacctmgr -n list cluster format=cluster | grep -qw csrun || sacctmgr -i add cluster csrun >/dev/null
}

start_slurmd() {  # start_slurmd NODENAME: in its host's namespace, or here for the one-host shape
    pid_alive "$DIR/run/slurmd-$1.pid" && return 0
    if ((NODES == 0)); then
        slurmd -f "$SLURM_CONF"
    else
        nsenter --net="/run/netns/$(netns_of "$1")" slurmd -N "$1" -f "$SLURM_CONF"
    fi
}

start_slurm() {
    pid_alive "$DIR/run/slurmctld.pid" || slurmctld
    wait_for 60 slurmctld scontrol ping
    local n
    for n in $(node_names); do start_slurmd "$n"; done
    for n in $(node_names); do wait_for 60 "node $n" node_ready "$n"; done
}

node_ready() {  # node_ready NODENAME
    local state
    state="$(sinfo -h -n "$1" -o %T 2>/dev/null)" || return 1
    case "$state" in
        idle*|mixed*|allocated*) return 0 ;;
        down*|drain*) scontrol update nodename="$1" state=resume >/dev/null 2>&1; return 1 ;;
        *) return 1 ;;
    esac
}

cs_answers() { timeout 2 bash -c "exec 3<>/dev/tcp/$CS_ADDR/$CS_PORT" 2>/dev/null; }

start_cs() {  # the CS system as a service on its own host
    pid_alive "$DIR/run/cs.pid" && return 0
    [[ -x $PYTHON ]] || die "no Python at $PYTHON to run the CS system (hint: make venv, or set CSRUN_PYTHON)"
    nsenter --net="/run/netns/$(netns_of cs)" setsid "$PYTHON" -c \
        "import sys; from wse_sim.cli import main; sys.exit(main())" serve --fabric "${CSRUN_CS_FABRIC:-cs1}" \
        --host "$CS_ADDR" --port "$CS_PORT" --idle-timeout 20 </dev/null >>"$DIR/log/cs.log" 2>&1 &
    echo $! >"$DIR/run/cs.pid"
    wait_for 60 "the CS system at $CS_ADDR:$CS_PORT" cs_answers
}

all_up() {
    pid_alive "$DIR/run/slurmctld.pid" || return 1
    local n
    for n in $(node_names); do pid_alive "$DIR/run/slurmd-$n.pid" && node_ready "$n" || return 1; done
    ((NODES == 0)) || pid_alive "$DIR/run/cs.pid"
}

up() {
    mkdir -p "$DIR/log" "$DIR/etc"
    if [[ -s $DIR/etc/nodes && $(cat "$DIR/etc/nodes") != "$NODES" ]] && pid_alive "$DIR/run/slurmctld.pid"; then
        die "the cluster in $DIR is up with CSRUN_SLURM_NODES=$(cat "$DIR/etc/nodes"), not $NODES (hint: cluster.sh down first)"
    fi
    if all_up; then
        say "already up (SLURM_CONF=$SLURM_CONF)"
        return 0
    fi
    ((NODES == 0)) || CTLD_ADDR="$SUBNET.1"
    install_packages
    configure
    ((NODES == 0)) || make_network
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurm
    if ((NODES == 0)); then
        say "up: node $NODE, $CPUS CPUs, gres cs:1, partition $PARTITION (export SLURM_CONF=$SLURM_CONF)"
    else
        start_cs
        say "up: nodes node[1-$NODES] at $SUBNET.11-$((10 + NODES)), controller $CTLD_ADDR, the CS system at" \
            "$CS_ADDR:$CS_PORT (license cs:1), partition $PARTITION (export SLURM_CONF=$SLURM_CONF)"
    fi
}

stop_pid() {  # stop_pid PIDFILE NAME
    [[ -s "$1" ]] || return 0
    local pid
    pid="$(cat "$1")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
        say "stopped $2 ($pid)"
    fi
    rm -f "$1"
}

remove_network() {  # every namespace and link of this port base's prefix, whatever the last run left
    local ns pids
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
        pids="$(ip netns pids "$ns" 2>/dev/null || true)"  # tasks a dead slurmd left behind
        [[ -z $pids ]] || { kill -9 $pids 2>/dev/null || true; say "killed leftover processes in $ns: $pids"; }
        ip netns del "$ns" && say "removed namespace $ns"
    done
    local link
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$PREFIX" || true); do
        ip link del "$link" 2>/dev/null && say "removed link $link"
    done
    return 0
}

down() {
    stop_pid "$DIR/run/cs.pid" "the CS system"
    local f
    for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmd.pid"; do
        [[ -e $f ]] && stop_pid "$f" "slurmd $(basename "$f" .pid | sed 's/^slurmd-//')"
    done
    stop_pid "$DIR/run/slurmctld.pid" slurmctld
    stop_pid "$DIR/run/slurmdbd.pid" slurmdbd
    stop_pid "$DIR/mysql/mariadbd.pid" mariadbd
    stop_pid "$DIR/munge/munged.pid" munged
    [[ $(id -u) != 0 ]] || remove_network
    rm -f "$DIR/etc/nodes"
}

env_lines() {
    echo "export SLURM_CONF=$SLURM_CONF"
    local nodes=0
    [[ -s $DIR/etc/nodes ]] && nodes="$(cat "$DIR/etc/nodes")"
    ((nodes == 0)) || echo "# the CS system: csrun_wse --cs_ip $CS_ADDR:$CS_PORT"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) pid_alive "$DIR/run/slurmctld.pid" && timeout 10 scontrol ping 2>/dev/null | grep -q UP ;;
    env) env_lines ;;
    *) die "usage: $0 up|down|status|env" ;;
esac
