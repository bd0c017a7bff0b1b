#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine with Rust: redis-server,
# redis-tools (redis-cli, redis-benchmark), and openssl (the TLS tests make throw-away
# certificates with it). Safe to run again: it installs only what is missing.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v redis-cli && command -v redis-benchmark; } >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if ((${#missing[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is missing; install Rust (https://rustup.rs) first" >&2
    exit 1
fi
