#!/usr/bin/env bash
# Install Chromium from the system's packages for the browser test (tests/workshop/test_browser.py drives
# it headless through Playwright; Playwright's own browser download is never used).
# Called by tools/setup.sh on the test path; safe to run again.
set -euo pipefail

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

for browser in "${SCALEDL_CHROMIUM:-}" chromium chromium-browser; do
    if [ -n "$browser" ] && command -v "$browser" >/dev/null; then
        exit 0
    fi
done
if ! command -v apt-get >/dev/null; then
    log "no apt-get here: Chromium not installed, so tests/workshop/test_browser.py will be skipped" \
        "(install Chromium yourself and set SCALEDL_CHROMIUM to its path to run it)"
    exit 0
fi
log "installing Chromium from the system's packages (for the browser test)"
as_root apt-get update -qq
# Debian calls the package chromium; Ubuntu's chromium-browser is a snap stub that does not run here.
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
