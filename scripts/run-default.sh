#!/usr/bin/env bash
# The main job: set-up, fetch the embedded default policy, and train a campaign of versions on it.
# Running it again continues (or just reports) the same campaign. Extra args go to `evotrainer run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/evotrainer models fetch
CAMPAIGN="${CAMPAIGN:-data/campaigns/default}"
resume=()
[ -f "$CAMPAIGN/campaign.json" ] && resume=(--resume)
exec .venv/bin/evotrainer run --preset default --campaign "$CAMPAIGN" "${resume[@]}" "$@"
