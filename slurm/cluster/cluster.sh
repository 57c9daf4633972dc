#!/usr/bin/env bash
# A real one-host Slurm on loopback: munge, MariaDB, slurmdbd, slurmctld, slurmd.
#
#   slurm/cluster/cluster.sh up      # install what is missing (apt, needs root), start, wait for the node
#   slurm/cluster/cluster.sh down    # stop every daemon it started (by the pids it recorded)
#   slurm/cluster/cluster.sh status  # exit 0 when the controller answers
#   slurm/cluster/cluster.sh env     # the line to export, e.g. eval "$(slurm/cluster/cluster.sh env)"
#
# Everything (configs, state, spool, logs, pids, sockets, the database) lives under one folder,
# $CSRUN_SLURM_DIR (default /tmp/csrun-slurm). The Slurm commands find this cluster through
# SLURM_CONF=$CSRUN_SLURM_DIR/etc/slurm.conf: nothing is written to /etc, so the machine's
# other users (and csrun's local-backend tests) do not see it unless they export SLURM_CONF.
# `up` is idempotent: daemons already running are reused. Ports (loopback only): slurmctld
# 16817, slurmd 16818, slurmdbd 16819, MariaDB 16306 (override with CSRUN_SLURM_PORT_BASE=N:
# N+17, N+18, N+19, N+6).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${CSRUN_SLURM_DIR:-/tmp/csrun-slurm}"
BASE="${CSRUN_SLURM_PORT_BASE:-16800}"
CTLD_PORT=$((BASE + 17)) SLURMD_PORT=$((BASE + 18)) DBD_PORT=$((BASE + 19)) DB_PORT=$((BASE + 6))
NODE="$(hostname -s)"
CPUS="${CSRUN_SLURM_CPUS:-8}"          # declared, more than the machine has (config_overrides)
PARTITION="${CSRUN_SLURM_PARTITION:-csrun}"
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge)
export SLURM_CONF="$DIR/etc/slurm.conf"

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
        -e "s|@MEM_MB@|${CSRUN_SLURM_MEM_MB:-4096}|g" "$HERE/$1" >"$2.tmp"
    chmod "$3" "$2.tmp"
    mv "$2.tmp" "$2"
}

configure() {
    mkdir -p "$DIR"/{etc,state,spool,log,run}
    chmod 755 "$DIR"
    [[ -s "$DIR/etc/db_pass" ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/etc/db_pass")
    render slurm.conf.in "$DIR/etc/slurm.conf" 644
    render gres.conf.in "$DIR/etc/gres.conf" 644
    render slurmdbd.conf.in "$DIR/etc/slurmdbd.conf" 600  # slurmdbd reads it next to $SLURM_CONF
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

start_slurm() {
    pid_alive "$DIR/run/slurmctld.pid" || slurmctld
    wait_for 60 slurmctld scontrol ping
    pid_alive "$DIR/run/slurmd.pid" || slurmd
    wait_for 60 "node $NODE" node_ready
}

node_ready() {
    local state
    state="$(sinfo -h -n "$NODE" -o %T 2>/dev/null)" || return 1
    case "$state" in
        idle*|mixed*|allocated*) return 0 ;;
        down*|drain*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1; return 1 ;;
        *) return 1 ;;
    esac
}

up() {
    mkdir -p "$DIR/log"
    if pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid" && node_ready; then
        say "already up (SLURM_CONF=$SLURM_CONF)"
        return 0
    fi
    install_packages
    configure
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurm
    say "up: node $NODE, $CPUS CPUs, gres cs:1, partition $PARTITION (export SLURM_CONF=$SLURM_CONF)"
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

down() {
    stop_pid "$DIR/run/slurmd.pid" slurmd
    stop_pid "$DIR/run/slurmctld.pid" slurmctld
    stop_pid "$DIR/run/slurmdbd.pid" slurmdbd
    stop_pid "$DIR/mysql/mariadbd.pid" mariadbd
    stop_pid "$DIR/munge/munged.pid" munged
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) pid_alive "$DIR/run/slurmctld.pid" && timeout 10 scontrol ping 2>/dev/null | grep -q UP ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    *) die "usage: $0 up|down|status|env" ;;
esac
