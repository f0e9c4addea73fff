"""What the loop's stories need before their first hop: a Feast repository
of their own up to today, the operator watching the test's namespace with
the story's settings, and the example objects for this run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator

from kubeloop.cli.demo import load_examples
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import create_repository
from kubeloop.paths import repo_root
from kubeloop.story.loop import Timings, operator_env, prepare


def story_inputs(platform, namespace: str, start_operator, tmp_path: Path) -> tuple[dict, Path, list[dict]]:  # noqa: ANN001
    """(the platform's env, the repository, the prepared examples), the operator started."""
    env = platform.env()
    # A repository of its own, up to today: the story replaces its last two weeks.
    repo = create_repository(tmp_path / "featurestore", Scenario(start=default_start(45), days=45))
    op = start_operator([namespace], **operator_env(env, repo, tmp_path / "work"))
    op.wait_for_log("webhooks and /metrics on", timeout=60)
    return env, repo, quick_optimisation(prepare(load_examples(repo_root() / "examples"), namespace,
                                                 f"{namespace}-fraud", Timings()))


def quick_optimisation(docs: list[dict], retrain: bool = True) -> list[dict]:
    """The docs with the example OptimizedModel measuring only the three
    techniques its retrain measures, at the SLO's batch size: every
    technique is test_optimization's to prove, and eight of them cost a story
    about 45 s. retrain=False also drops the retrain's optimisation."""
    for doc in docs:
        if doc["kind"] == "OptimizedModel":
            doc["spec"].update(techniques=["onnx", "onnx-int8", "static-int8"], batchSizes=[32])
        elif doc["kind"] == "InferenceService" and not retrain:
            doc["spec"].get("retraining", {}).pop("optimization", None)
    return docs


def timed_steps(story) -> Iterator[Callable[[], str]]:  # noqa: ANN001 - a kubeloop.story Loop
    """Run the story's hops in order, printing what each showed and how long
    it took (a failure's report then says where the minutes went); yields
    each hop once it has run."""
    for title, step in story.steps():
        started = time.monotonic()
        shown = step()
        print(f"{title} ({time.monotonic() - started:.0f} s): {shown}")
        yield step
