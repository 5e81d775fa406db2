#!/bin/bash
# costguard launch: the boot script of one attempt of one job.
#
# Rendered by costguard.spot.bootstrap: every double-braced name below becomes one shell
# word quoted with shlex, never by raw text. The same script is AWS user-data, the GCP
# startup-script metadata value and Azure customData (cloud-init runs a #! script as is).
#
# There is no secret in here, on purpose: the checkpoint store is reached with the
# instance's own identity (AWS instance profile, GCP service account, Azure managed
# identity), which fsspec's backends pick up from the metadata service.
set -uo pipefail
umask 022
mkdir -p /var/log/costguard
exec >>/var/log/costguard/bootstrap.log 2>&1
echo "costguard bootstrap: starting at $(date -u +%FT%TZ)"

export HOME="${HOME:-/root}"
export COSTGUARD_JOB_ID={{ job_id }}
export COSTGUARD_JOB_ATTEMPT={{ attempt }}
export COSTGUARD_STOP_CHECK={{ stop_check }}
export COSTGUARD_CLOUD={{ cloud }}
ARRAY_TASK={{ array_task }}
if [ -n "$ARRAY_TASK" ]; then
    # A task of costguard launch --array: its index, as SLURM_ARRAY_TASK_ID on a cluster.
    export COSTGUARD_ARRAY_TASK_ID="$ARRAY_TASK"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
INDEX_URL={{ index_url }}
if [ -n "$INDEX_URL" ]; then
    # The site's package mirror (the index_url option), for pip and uv. pixi reads its
    # own: the manifest's index-url and the mirrors of its config.toml.
    export PIP_INDEX_URL="$INDEX_URL" UV_DEFAULT_INDEX="$INDEX_URL"
fi

WORKDIR={{ workdir }}
GIT_REPO={{ git_repo }}
GIT_REF={{ git_ref }}
PACKAGE={{ package }}
WHEEL_URL={{ wheel_url }}
WHEEL_SHA256={{ wheel_sha256 }}
WHEEL_FILE={{ wheel_file }}
FETCHER={{ fetcher }}
SHUTDOWN_MINUTES={{ shutdown_minutes }}
VENV=/opt/costguard/venv

fail() {
    echo "costguard bootstrap: $*"
    if [ "$SHUTDOWN_MINUTES" != never ]; then
        shutdown -h "+$SHUTDOWN_MINUTES" "costguard: bootstrap failed"
    fi
    exit 1
}

# costguard itself: the wheel the controller runs, fetched from the checkpoint store with
# this instance's identity and installed only if its sha256 matches; or the package option.
# Never the bare name "costguard" from the public index: that is someone else's project.
install_costguard() {  # "$@": the python to install into
    if [ -n "$PACKAGE" ]; then
        "$@" -m pip install --quiet "$PACKAGE"
        return
    fi
    [ -n "$WHEEL_URL" ] || { echo "costguard bootstrap: no costguard wheel or package given"; return 1; }
    "$@" -m pip install --quiet "fsspec>=2026.9" "$FETCHER" || return 1
    mkdir -p "$(dirname "$WHEEL_FILE")" || return 1
    "$@" - "$WHEEL_URL" "$WHEEL_FILE" <<'FETCH' || return 1
import sys

import fsspec

with fsspec.open(sys.argv[1], "rb") as source, open(sys.argv[2], "wb") as target:
    target.write(source.read())
FETCH
    echo "$WHEEL_SHA256  $WHEEL_FILE" | sha256sum --check --status - \
        || { echo "costguard bootstrap: $WHEEL_FILE does not match its sha256"; return 1; }
    "$@" -m pip install --quiet "$WHEEL_FILE[train]"
}

mkdir -p "$WORKDIR" || fail "cannot create $WORKDIR"
cd "$WORKDIR" || fail "cannot enter $WORKDIR"

if [ -n "$GIT_REPO" ] && [ ! -d .git ]; then
    command -v git >/dev/null || { apt-get update -q && apt-get install -y -q git; } \
        || dnf install -y -q git || fail "git is missing and cannot be installed"
    git clone --quiet "$GIT_REPO" . || fail "cannot clone the code"
    if [ -n "$GIT_REF" ]; then
        git checkout --quiet "$GIT_REF" || fail "cannot check out the code's ref"
    fi
fi

if [ -f pixi.toml ]; then
    # The project pins its environment with pixi: use it, and add costguard if it lacks it.
    export PATH="$HOME/.pixi/bin:$PATH"
    if ! command -v pixi >/dev/null; then
        curl -fsSL https://pixi.sh/install.sh | bash || fail "cannot install pixi"
    fi
    pixi install || fail "pixi install failed"
    if ! pixi run costguard --version >/dev/null 2>&1; then
        install_costguard pixi run python || fail "cannot install costguard"
    fi
    RUN=(pixi run)
else
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV" || {
            { apt-get update -q && apt-get install -y -q python3-venv; } || dnf install -y -q python3
            python3 -m venv "$VENV"
        } || fail "cannot create a Python environment"
    fi
    install_costguard "$VENV/bin/python" || fail "cannot install costguard"
    if [ -f requirements.txt ]; then
        "$VENV/bin/python" -m pip install --quiet -r requirements.txt \
            || fail "cannot install requirements.txt"
    fi
    export PATH="$VENV/bin:$PATH"
    RUN=()
fi

NODES={{ nodes }}
# The public key the controller signs each node's rank and rendezvous with (no secret).
TOLD_KEY=''
if [ "$NODES" -gt 1 ]; then
    # One node of a gang (--nodes): its rank and node 0's private address come from this
    # instance's own metadata, written and signed by the controller once every node is
    # up, never from the checkpoint store (whose writers could send the collectives
    # elsewhere); values whose signature does not hold for this instance are not used.
    gang=$(${RUN[@]+"${RUN[@]}"} python -m costguard.spot.node --cloud {{ cloud }} \
        --nodes "$NODES" --told-key "$TOLD_KEY") \
        || fail "this node was not told its rank and rendezvous"
    read -r NODE_RANK RDZV_ENDPOINT <<<"$gang"
    # costguard run writes this node's own exit record (job/attempt-N.node-R.exit.json).
    export COSTGUARD_NODE_RANK="$NODE_RANK"
    LAUNCHER=({{ torchrun }} --node-rank "$NODE_RANK" --rdzv-endpoint "$RDZV_ENDPOINT"
        --rdzv-id "$COSTGUARD_JOB_ID-$COSTGUARD_JOB_ATTEMPT")
    echo "costguard bootstrap: node $NODE_RANK of $NODES, meeting at $RDZV_ENDPOINT"
fi

echo "costguard bootstrap: running attempt $COSTGUARD_JOB_ATTEMPT of job $COSTGUARD_JOB_ID"
${RUN[@]+"${RUN[@]}"} costguard run --checkpoint {{ checkpoint_url }} --cloud {{ cloud }} {{ run_options }} -- {{ launcher }}{{ command }}
status=$?
echo "costguard bootstrap: the job exited with $status at $(date -u +%FT%TZ)"

# The controller terminates the instance when it sees the job end; this is the safety net
# for a controller that is gone (a guest shutdown ends the compute bill on AWS and GCP).
if [ "$SHUTDOWN_MINUTES" != never ]; then
    shutdown -h "+$SHUTDOWN_MINUTES" "costguard: the job exited with $status"
fi
exit "$status"
