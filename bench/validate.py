"""Validation cost of a manifest listing 10,000 inputs, against a bare yaml.safe_load.

Builds a throw-away project with 10,000 input files and a manifest that lists every one
of them (as expected refusals, the longest list a manifest holds), then times
`load_manifest` (parse with line numbers, pydantic, every rule, the directory listing,
the secret scan) against `yaml.safe_load` of the same text, in the same process.
Target: validation costs under 5x the YAML parse. PREFLIGHT_BENCH_SMOKE=1: 500 inputs, one
round (a smoke run that checks the bench runs to its verdict line, not the target).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.manifest.load import load_manifest  # noqa: E402

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
COUNT = 500 if SMOKE else 10_000
ROUNDS = 1 if SMOKE else 5
TARGET = 5.0


def build(root: Path) -> str:
    data = root / "data" / "corpus"
    data.mkdir(parents=True)
    ids = [f"item-{i:05d}" for i in range(COUNT)]
    for item in ids:
        (data / f"{item}.txt").write_text("x", encoding="utf-8")
    listed = "\n".join(f"    - {item}" for item in ids)
    return f"""apiVersion: preflight/v1
name: bench-10k
hardware: {{gpu: H100, lots: 1, days: 7, lot_price_usd_per_day: "2.50"}}
backend: cuda
preparation: pytorch
inputs:
  dir: data/corpus
  pattern: "*.txt"
  expected_count: {COUNT}
  expected_refusals:
{listed}
task:
  handler: runner.workloads.classify:handle
  categories: [a, b]
"""


def median_time(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = build(root)
        loaded = load_manifest(text, source="bench", base_dir=root)
        assert len(loaded.manifest.inputs.expected_refusals) == COUNT
        parse = median_time(lambda: yaml.safe_load(text))
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        c_parse = median_time(lambda: yaml.load(text, Loader=loader))  # noqa: S506
        validate = median_time(lambda: load_manifest(text, source="bench", base_dir=root))
    ratio = validate / parse
    print(f"manifest: {len(text) / 1024:.0f} KiB, {COUNT} inputs listed, {ROUNDS} rounds")
    print(f"yaml.safe_load (baseline): {parse * 1000:.1f} ms per manifest")
    print(f"load_manifest (full validation): {validate * 1000:.1f} ms per manifest")
    print(f"for reference, libyaml parse alone: {c_parse * 1000:.1f} ms "
          f"(validation = {validate / c_parse:.1f}x that)")
    verdict = "PASS" if ratio < TARGET else "MISS"
    print(f"validation_cost_ratio: {ratio:.2f} (target < {TARGET:g}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
