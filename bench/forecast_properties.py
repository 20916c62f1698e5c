"""The fill forecast's property tests with the long hypothesis profile: many more generated traces than CI.

    .venv/bin/python bench/forecast_properties.py [--examples 200] [-k stops] [--seed N]

Runs tests/test_forecast_properties.py with FORECAST_PROFILE=forecast-long (randomized, `--examples` traces
per property; CI runs the derandomized `forecast-ci` profile). A counter-example is printed with hypothesis'
reproduction blob; shrink it into an explicit case in the test file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200, help="traces per property")
    ap.add_argument("-k", default=None, help="only the properties matching (pytest -k)")
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    args = ap.parse_args()
    env = dict(os.environ, FORECAST_PROFILE="forecast-long", FORECAST_EXAMPLES=str(args.examples))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_forecast_properties.py"]
    if args.k:
        cmd += ["-k", args.k]
    if args.seed is not None:
        cmd += [f"--hypothesis-seed={args.seed}"]
    return subprocess.call(cmd, env=env, cwd=REPO)


if __name__ == "__main__":
    raise SystemExit(main())
