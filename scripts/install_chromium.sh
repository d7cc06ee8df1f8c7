#!/usr/bin/env bash
# Debian's Chromium for `make test-browser` (Playwright's own browser download cannot be fetched on
# every machine). Installs it with apt when missing and possible; otherwise says why, and the
# browser test skips with that reason (or fails, where REQUIRE_BROWSER=1).
set -uo pipefail
if [ -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: chromium is missing and apt-get as root is not available here"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# Recommended packages included: they bring the fonts the screenshots need.
apt-get install -y chromium >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y chromium >/dev/null; } \
    || echo "install_chromium: apt-get could not install chromium"
command -v chromium >/dev/null 2>&1 && chromium --version
exit 0
