"""What the loop's stories need before their first hop: a Feast repository
of their own up to today, the operator watching the test's namespace with
the story's settings, and the example objects for this run."""

from __future__ import annotations

from pathlib import Path

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
    return env, repo, prepare(load_examples(repo_root() / "examples"), namespace, f"{namespace}-fraud", Timings())
