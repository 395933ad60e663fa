#!/usr/bin/env bash
# Installs the distribution's Chromium (root, apt-get) for `python scripts/docs.py screenshots`, which
# looks at the built documentation site in a real browser. Nothing else needs it; .ci/run skips the
# screenshots, saying so, where no Chromium is installed.
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
    echo "chromium is already installed"; exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "cannot install chromium: needs root and apt-get (Debian/Ubuntu); install a Chromium by hand" >&2
    exit 1
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
