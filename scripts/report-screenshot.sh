#!/usr/bin/env bash
# Render an HTML report (--moeperf-html) in headless Chromium (Debian's `chromium`) to a PNG, e.g. the README's
# docs/img/report.png:  scripts/report-screenshot.sh .tox/moeperf-report.html docs/img/report.png [WIDTH,HEIGHT]
# No network: the report embeds its images, and these flags stop Chromium's own background traffic.
set -euo pipefail
html=$(realpath "$1")
out=$(realpath -m "$2")
size=${3:-1280,1600}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
    --window-size="$size" --screenshot="$out" "file://$html" 2>/dev/null
test -s "$out"
echo "wrote $out"
