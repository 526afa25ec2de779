#!/usr/bin/env bash
# Install the comparison tools ("peers") for the benchmarks. Idempotent.
#
#  * the PyPI release of ratarmount, into its own venv at benchmarks/work/peer-venv
#    (never into the main environment: its `ratarmount` command would shadow ours);
#  * Debian's archivemount, squashfuse and squashfs-tools via apt-get, when missing.
#
# Usage: bash benchmarks/setup_peers.sh            (PEER_VERSION=1.2.0 to pin a release)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$HERE/work"
VENV="$WORK/peer-venv"
PYTHON="${PYTHON:-python3}"
PEER_SPEC="ratarmount${PEER_VERSION:+==$PEER_VERSION}"

mkdir -p "$WORK"

# --- the peer: PyPI ratarmount in its own venv ----------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_peers: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("ratarmount")' >/dev/null 2>&1 \
        && [ -x "$VENV/bin/ratarmount" ] && [ -z "${PEER_VERSION:-}" ]; then
    echo "setup_peers: peer ratarmount already installed ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("ratarmount"))'))"
else
    echo "setup_peers: installing $PEER_SPEC into $VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet "$PEER_SPEC"
fi
"$VENV/bin/ratarmount" --version 2>&1 | head -n 3 || true

# --- Debian tools ---------------------------------------------------------------------------
missing=()
command -v archivemount >/dev/null 2>&1 || missing+=(archivemount)
command -v squashfuse   >/dev/null 2>&1 || missing+=(squashfuse)
command -v mksquashfs   >/dev/null 2>&1 || missing+=(squashfs-tools)
command -v fuser        >/dev/null 2>&1 || missing+=(psmisc)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        SUDO=sudo
    else
        SUDO=
    fi
    echo "setup_peers: apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    for pkg in "${missing[@]}"; do
        # Install one by one so that a package missing from this Debian release does not
        # stop the others.
        if apt-cache show "$pkg" >/dev/null 2>&1; then
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$pkg" >/dev/null \
                || echo "setup_peers: warning: could not install $pkg" >&2
        else
            echo "setup_peers: warning: $pkg is not available from apt" >&2
        fi
    done
else
    echo "setup_peers: archivemount, squashfuse, mksquashfs and fuser already installed"
fi
echo "setup_peers: done"
