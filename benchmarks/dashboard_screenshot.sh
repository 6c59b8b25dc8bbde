#!/usr/bin/env bash
# Render the dashboard of the README's headline store in headless Chromium to docs/dashboard.png.
# Needs chromium (`apt-get install -y chromium`); CI does not run this. The page is self-contained
# (plotly.js inlined), so the browser fetches nothing. Usage: benchmarks/dashboard_screenshot.sh [store] [png]
set -euo pipefail
cd "$(dirname "$0")/.."
store=${1:-results/squares-paired-nvidia-h100-80gb-hbm3.sqlite}
png=${2:-docs/dashboard.png}
html=$(mktemp -d)/dashboard.html
PYTHONPATH=. python3 -m cutlass_tune.cli dashboard --storage "$store" -o "$html"
# --virtual-time-budget lets plotly draw every figure before the shot; --no-sandbox: containers run as root.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=20000 \
    --window-size=1400,2400 --screenshot="$png" "file://$html"
rm -r "$(dirname "$html")"
echo "wrote $png"
