#!/usr/bin/env bash
# The whole test suite: set-up, then every test this machine can run (fast, slow and browser;
# gpu and live-api tests need hardware or a key and are skipped here). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-browser.sh
exec .venv/bin/python -m pytest -m "not gpu and not live_api" "$@"
