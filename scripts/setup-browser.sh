#!/usr/bin/env bash
# Debian's Chromium for the browser tests (Playwright's Python package drives /usr/bin/chromium;
# `playwright install` is never used). Idempotent: does nothing when chromium is present.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "setup-browser: chromium is missing and this is not root; install Debian's chromium package" >&2
  exit 1
fi
echo "setup-browser: installing Debian's chromium"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
