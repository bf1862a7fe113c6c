#!/usr/bin/env bash
# Regenerates the committed example reports under reports/examples/ from the
# fixtures (report.md, report.json, parity.svg per example), with the same
# code path the CI check uses (tests/report_render.rs, `examples_are_current`).
# The list of examples and their command lines lives in that test.
set -euo pipefail
cd "$(dirname "$0")/.."
HSPARITY_REGEN_EXAMPLES=1 cargo test --release --test integration report_render::examples_are_current -- --exact
git status --short reports/examples
