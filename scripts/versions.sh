#!/usr/bin/env bash
# Proves the version requirements of Cargo.toml: builds and tests the crate (every feature)
# with each direct dependency at the lowest version its requirement allows ("floor"), then at
# the newest ("newest"). Each runs in a copy of the repository, so the committed Cargo.lock,
# which the README's test command uses, stays as it is.
#
# Each resolution builds every target (library, lockctl, examples, tools, tests, benches),
# which compiles every use of every dependency, then runs a subset of the tests that still
# exercises each dependency at run time, on Redis (the default server), in a few minutes:
# ./scripts/test.sh has already run the whole suite, on Redis and on Valkey, with Cargo.lock.
# The subset: the library's unit tests and doc tests; `locking` (redis-rs, deadpool-redis,
# tokio: the engine), `layer` and `layer_logs` (tower, tower-test, http, http-body-util,
# tracing, tracing-subscriber), `layer_limit` and `metrics` (metrics, metrics-util),
# `axum_integration` and `axum_example` (axum, hyper, serde, metrics-exporter-prometheus),
# `tonic_example` (tonic, prost, tonic-prost), `escaping` (proptest, percent-encoding),
# `cluster` (redis-rs's cluster client, crc16), `sentinel` (its sentinel client), `security`
# (rustls: TLS, AUTH, ACL), `lockctl` (serde_json, the cli feature), `body_keys`
# (serde_json and http-body, the json feature) and `idempotency` (ring's SHA-256, http-body). Not run here: the chaos runs and the fault,
# topology and per-kind tests, which add no dependency (cap, stats_alloc, criterion and nix
# are only built: examples, benches and the chaos worker).
#
#   ./scripts/versions.sh            # both
#   ./scripts/versions.sh floor      # or newest
#
# The floor resolution is cargo's -Z direct-minimal-versions (direct dependencies at their
# floors, the rest as new as they allow), an unstable flag that RUSTC_BOOTSTRAP=1 lets the
# stable toolchain use for this one command. The script then checks that every direct
# dependency resolved to exactly the version Cargo.toml states, so a floor that another crate
# silently raises fails here instead of going unproven.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Shared with the main build: dependencies that did not change are not built again.
export CARGO_TARGET_DIR="$repo/target"

# Every direct dependency at exactly the version Cargo.toml names in its requirement.
check_floors() {
    cargo metadata --format-version 1 --locked --all-features | python3 -c '
import json, re, sys
meta = json.load(sys.stdin)
root = meta["resolve"]["root"]
package = next(p for p in meta["packages"] if p["id"] == root)
node = next(n for n in meta["resolve"]["nodes"] if n["id"] == root)
resolved = {}
for dep in node["deps"]:
    pkg = next(p for p in meta["packages"] if p["id"] == dep["pkg"])
    resolved[pkg["name"]] = pkg["version"]
bad = []
for dep in package["dependencies"]:
    floor = re.sub(r"^\^", "", dep["req"])
    got = resolved.get(dep["name"])
    if got != floor:
        bad.append("{}: requires {} but resolved {}".format(dep["name"], dep["req"], got))
if bad:
    print("floors not met (raise the requirement to what resolves):", *bad, sep="\n  ")
    sys.exit(1)
print("floors: every direct dependency at the version Cargo.toml states")
'
}

# The integration tests each resolution runs (see the top of this file).
subset=()
for test in locking layer layer_logs layer_limit metrics axum_integration axum_example \
    tonic_example escaping cluster sentinel security lockctl body_keys idempotency; do
    subset+=(--test "$test")
done

run() {
    local which=$1 copy="$work/$1"
    echo "== versions: $which"
    mkdir -p "$copy"
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$copy"
    (
        cd "$copy"
        case "$which" in
        floor)
            RUSTC_BOOTSTRAP=1 cargo update -Z direct-minimal-versions --quiet
            check_floors
            ;;
        newest) cargo update --quiet ;;
        *)
            echo "unknown: $which (floor or newest)" >&2
            exit 2
            ;;
        esac
        cargo tree --locked --all-features -e normal,dev --depth 1 --prefix none |
            grep -v -e '^tower-redis-lock ' -e ' (\*)$' | sort -u | tr '\n' ' '
        echo
        # The crate's own binaries from the build before are stale: drop them, so the disk
        # holds one resolution's test binaries at a time (dependencies stay shared).
        cargo clean --quiet --locked -p tower-redis-lock
        cargo build --locked --all-features --all-targets
        cargo test --locked --all-features --lib --bins "${subset[@]}"
        cargo test --locked --all-features --doc
    )
}

if (($# == 0)); then
    set -- floor newest
fi
for which in "$@"; do
    run "$which"
done
