#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need (OpenSSH server and
# client, rsync, iproute2, passwd, Slurm and munge from the system packages; the virtualenv),
# then runs pytest. Extra arguments go to pytest (e.g. scripts/test.sh -k sync).
#
# --fast: for a machine without root, network namespaces or Slurm. It leaves out the tests
# marked root, netns or slurm (tests/support/tiers.py), says at the start and the end how many
# of each and how to run everything, and needs only the OpenSSH client and rsync of the system
# packages. Refused where CI is set: CI runs everything (.ci/run), and there a skip fails.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=""
for arg in "$@"; do
    [ "$arg" != --fast ] || fast=1
done
if [ -n "$fast" ] && [ -n "${CI:-}" ] && [ "${CI,,}" != false ] && [ "${CI}" != 0 ]; then
    echo "--fast leaves tests out, and CI runs every tier: run bash scripts/test.sh (CI=$CI is set here)" >&2
    exit 2
fi
missing=()
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
if [ -z "$fast" ]; then
    command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || missing+=(iproute2)
    command -v useradd >/dev/null 2>&1 || [ -x /usr/sbin/useradd ] || missing+=(passwd)
    command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
    command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
    command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
    command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || missing+=(munge)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        if [ -n "$fast" ]; then
            echo "tests need: ${missing[*]} (install them, or run as root)" >&2
        else
            echo "tests need: ${missing[*]} (install them, or run as root; bash scripts/test.sh --fast needs only openssh-client and rsync)" >&2
        fi
        exit 2
    fi
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The packages' own services (munge, slurmctld, slurmd, sshd) are not started by the install:
    # the tests start private ones. policy-rc.d tells invoke-rc.d so, if nothing does already.
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && policy=1
    fi
    status=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
    [ -z "$policy" ] || rm -f /usr/sbin/policy-rc.d
    [ "$status" = 0 ] || exit "$status"
fi
[ -n "$fast" ] || mkdir -p /run/sshd 2>/dev/null || true
bash scripts/bootstrap.sh
# The suite starts orch's CLI some thousands of times: byte-compile the project once, so a
# machine with PYTHONDONTWRITEBYTECODE set does not compile it again in every process.
.venv/bin/python -m compileall -q orchestrator remote_payload tests >/dev/null
# Two worker processes (pytest-xdist), a test file's tests on one of them (its fixtures shared):
# much of the suite waits (on Slurm's scheduler, a job's steps, a cut link), so two keep a
# 2-core machine busy. Every shared name a test makes (ports, network namespaces, subnets,
# Slurm clusters, users) is unique per process or made safely twice. ORCH_TEST_WORKERS=0 runs
# it in one process; later arguments win (scripts/test.sh -n 0 -k sync).
# A short temporary root of its own (pytest's /tmp/pytest-of-USER/pytest-N/popen-gwN/ makes some
# tests' Unix socket paths longer than the 100 bytes orch allows one), removed after a
# run that passed.
base=$(mktemp -d "${TMPDIR:-/tmp}/orch-t.XXXXXX")
status=0
.venv/bin/python -m pytest -q --durations=25 -n "${ORCH_TEST_WORKERS:-2}" --dist loadfile --basetemp "$base" "$@" \
    || status=$?
[ "$status" != 0 ] || rm -rf "$base"
exit "$status"
