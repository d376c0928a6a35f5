#!/usr/bin/env bash
# Debian's headless Chromium for the browser tests (web UI tab, HTML reports). Installed once
# from the distribution's packages; never a browser download of a test tool's own.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "the browser tests need Debian's chromium; install it (apt-get install chromium) or run: make test-fast" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
echo "installing Debian's chromium for the browser tests (once)..." >&2
$SUDO apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
