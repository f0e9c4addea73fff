"""`make bench`: run the benchmark suites and print their tables.

    python -m tests.bench                 # every suite
    python -m tests.bench operator        # some suites
    python -m tests.bench operator --quick
    python -m tests.bench fleet           # Pod LISTs with 200 GPU InferenceServices
    python -m tests.bench repeatability   # the optimiser's choice, five times
    python -m tests.bench gpu             # AMP, GPU variants, GPU memory (standalone: tests.bench.gpu_suite)
    python -m tests.bench trainjob        # TrainJobs through Kubeflow Trainer on the real node
    python -m tests.bench trainer         # the trainer backend against the local one, and a lost node
    python -m tests.bench pool            # 1,000 models on a pool of four Tritons, against one Triton each
    python -m tests.bench pooled          # 1,000 pooled InferenceServices through the operator and the pool's front
    python -m tests.bench peers           # a pool's two Pods as peers (each model on its owner) against each alone
    python -m tests.bench scale           # one operator keeping 5,000 InferenceServices converged

Each suite measures against a baseline in the same process and reports the
ratio; every figure is repeated (at least five runs, or interleaved rounds)
and printed with its median and spread, a spread over 10% flagged (see
tests.bench.repeat). Results are also written as JSON under bench-results/
(git-ignored). Set KUBELOOP_TEST_STATE_DIR to reuse a running platform.
"""

from __future__ import annotations

from tests.bench import blas

BLAS_SET = blas.configure()  # before anything loads numpy

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
from contextlib import ExitStack, contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

from rich.console import Console  # noqa: E402

from kubeloop.dev.platform import Platform  # noqa: E402
from tests.bench import (  # noqa: E402
    drift_suite,
    features_suite,
    fleet_suite,
    front_suite,
    gpu_suite,
    operator_suite,
    optimization_suite,
    outcomes_suite,
    pool_peers_suite,
    pool_suite,
    pooled_services_suite,
    scale_suite,
    repeatability_suite,
    serving_suite,
    training_suite,
    trainer_suite,
    trainjob_suite,
)

SUITES = {"operator": operator_suite.run, "training": training_suite.run, "optimization": optimization_suite.run,
          "repeatability": repeatability_suite.run, "serving": serving_suite.run, "drift": drift_suite.run,
          "features": features_suite.run, "front": front_suite.run, "fleet": fleet_suite.run,
          "outcomes": outcomes_suite.run, "gpu": gpu_suite.run, "trainjob": trainjob_suite.run,
          "trainer": trainer_suite.run, "pool": pool_suite.run, "pooled": pooled_services_suite.run,
          "peers": pool_peers_suite.run, "scale": scale_suite.run}
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
    console.print(blas.describe(BLAS_SET))
    RESULTS.mkdir(exist_ok=True)
    with ExitStack() as stack:
        context = Context(stack)
        for name in args.suites or list(SUITES):
            results = SUITES[name](context, console, quick=args.quick)
            (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
