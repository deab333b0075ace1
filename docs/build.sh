#!/usr/bin/env bash
# Build the HTML docs as CI does (warnings are errors). Output: docs/_build/html/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
python -m sphinx -W --keep-going -q -b html docs docs/_build/html
