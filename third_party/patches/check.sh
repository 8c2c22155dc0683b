#!/usr/bin/env bash
# Check that third_party/quinn-proto is the published crate of its version with the patches of
# patches/quinn-proto/ applied in order (their names sort in that order): it fails naming each file
# that differs. The published crate comes through cargo (`cargo fetch` of a throwaway manifest that
# asks for that exact version), so the check needs what a build needs: the crates.io index.
#   third_party/patches/check.sh           # check
#   third_party/patches/check.sh --keep    # and leave published/ and patched/ in a directory it names
set -euo pipefail
HERE=$(dirname "$(realpath "$0")")
VENDORED=$(realpath "$HERE/../quinn-proto")
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$VENDORED/Cargo.toml" | head -1)
KEEP=${1:-}
WORK=$(mktemp -d /tmp/quinn-proto-patches.XXXXXX)
cleanup() { if [ "$KEEP" = --keep ]; then echo "kept: $WORK/published and $WORK/patched"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

mkdir -p "$WORK/fetch/src"
: >"$WORK/fetch/src/lib.rs"
cat >"$WORK/fetch/Cargo.toml" <<TOML
[package]
name = "fetch-published-quinn-proto"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
quinn-proto = "=$VERSION"

[workspace]
TOML
cargo fetch --quiet --manifest-path "$WORK/fetch/Cargo.toml"
CRATE=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/cache" -name "quinn-proto-$VERSION.crate" | head -1)
[ -n "$CRATE" ] || { echo "quinn-proto $VERSION was not fetched" >&2; exit 1; }
tar -xzf "$CRATE" -C "$WORK"
mv "$WORK/quinn-proto-$VERSION" "$WORK/published"
cp -r "$WORK/published" "$WORK/patched"
for p in "$HERE"/quinn-proto/*.patch; do
  patch --quiet --forward --no-backup-if-mismatch -p1 -d "$WORK/patched" <"$p" || {
    echo "$(basename "$p") does not apply to quinn-proto $VERSION with the patches before it" >&2
    exit 1
  }
done

# The crate's packaging files are not vendored; Cargo.lock is seedgate's own (for the crate's tests).
PACKAGING='^(\.cargo_vcs_info\.json|Cargo\.toml\.orig|Cargo\.lock|README\.md)$'
listing() { (cd "$1" && find . -type f | sed 's|^\./||' | grep -Ev "$PACKAGING" | sort); }
status=0
if ! diff <(listing "$WORK/patched") <(listing "$VENDORED") >/dev/null; then
  echo "files differ between the published crate with the patches (<) and third_party/quinn-proto (>):" >&2
  diff <(listing "$WORK/patched") <(listing "$VENDORED") | grep '^[<>]' >&2 || true
  status=1
fi
while read -r f; do
  if [ -f "$VENDORED/$f" ] && ! cmp -s "$WORK/patched/$f" "$VENDORED/$f"; then
    echo "$f: third_party/quinn-proto differs from the published crate with the patches:" >&2
    diff -u "$WORK/patched/$f" "$VENDORED/$f" | head -40 >&2 || true
    status=1
  fi
done < <(listing "$WORK/patched")
if [ "$status" = 0 ]; then
  echo "third_party/quinn-proto is quinn-proto $VERSION with $(ls "$HERE"/quinn-proto/*.patch | wc -l) patches applied"
fi
exit "$status"
