#!/usr/bin/env bash
# The package crates.io would get: `cargo publish --dry-run` builds it from its own files
# (so a file the library needs but the package leaves out fails here), its file list holds
# the library, its Lua, its guide, the examples, the README and the licenses and nothing of
# the repository's tests, tools, scripts, benches or docs/, and `cargo install` builds
# lockctl from it as the README says (in debug, on CI's target directory, to stay quick).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo publish --dry-run --locked --allow-dirty 2>&1 | grep -v '^warning: ignoring \(test\|benchmark\|example\) `' || {
    echo "package: cargo publish --dry-run failed" >&2
    exit 1
}

files=$(cargo package --list --locked --allow-dirty 2>/dev/null)
missing=()
for wanted in Cargo.toml README.md LICENSE-MIT LICENSE-APACHE src/lib.rs src/bin/lockctl/main.rs \
    src/wire/lua/acquire.lua src/guide/safety.md examples/quickstart_axum.rs; do
    grep -qx "$wanted" <<<"$files" || missing+=("$wanted")
done
unwanted=$(grep -E '^(tests|tools|scripts|benches|docs|\.ci|target)/|\.(pem|crt|key|csv)$' <<<"$files" || true)
if ((${#missing[@]})) || [[ -n "$unwanted" ]]; then
    echo "package: missing: ${missing[*]:-none}; not for the package: ${unwanted:-none}" >&2
    exit 1
fi
echo "package: $(wc -l <<<"$files") files, $(grep -c '\.lua$' <<<"$files") of them Lua; no tests, tools, scripts, benches or docs/"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
cargo install --locked --path . --features cli --debug --root "$root" --target-dir target --quiet
help=$("$root/bin/lockctl" --help)
grep -q waive-quarantine <<<"$help"
echo "package: cargo install --path . --features cli installs $root/bin/lockctl, and it runs"
