"""`make bench`: run the benchmark suites and print their tables.

    python -m tests.bench                 # every suite
    python -m tests.bench operator        # some suites
    python -m tests.bench operator --quick

Each suite measures against a baseline in the same process and reports the
ratio. Results are also written as JSON under bench-results/ (git-ignored).
Set KUBELOOP_TEST_STATE_DIR to reuse a running platform.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rich.console import Console

from kubeloop.dev.platform import Platform
from tests.bench import drift_suite, features_suite, operator_suite, optimization_suite, serving_suite, training_suite

SUITES = {"operator": operator_suite.run, "training": training_suite.run, "optimization": optimization_suite.run,
          "serving": serving_suite.run, "drift": drift_suite.run, "features": features_suite.run}
RESULTS = Path(__file__).resolve().parents[2] / "bench-results"


class Context:
    """What suites share: the live platform, started on first use only."""

    def __init__(self, stack: ExitStack):
        self._stack = stack
        self._platform: Platform | None = None

    @property
    def platform(self) -> Platform:
        if self._platform is None:
            self._platform = self._stack.enter_context(live_platform())
        return self._platform


@contextmanager
def live_platform():
    reuse = os.environ.get("KUBELOOP_TEST_STATE_DIR")
    if reuse and Platform(Path(reuse)).running():
        yield Platform(Path(reuse))
        return
    with tempfile.TemporaryDirectory(prefix="kubeloop-bench-") as tmp:
        platform = Platform(Path(tmp) / "platform")
        with Console(stderr=True).status("starting the platform"):
            platform.up()
        try:
            yield platform
        finally:
            platform.down()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench")
    parser.add_argument("suites", nargs="*", choices=[*SUITES, []], default=[])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    console = Console(width=160)
    RESULTS.mkdir(exist_ok=True)
    with ExitStack() as stack:
        context = Context(stack)
        for name in args.suites or list(SUITES):
            results = SUITES[name](context, console, quick=args.quick)
            (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
