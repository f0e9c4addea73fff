"""The feature-store port: what the operator asks of Feast."""

from __future__ import annotations

from kubeloop.featurestore.freshness import Materializer, StoreNeed, StoreState


class FeatureStores:
    """The operator's default Feast repository, and the online stores it keeps
    materialised for the InferenceServices that read them (Feast's
    materialisation behind it; none where no serving backend reads online
    features, as the operator's image then has no Feast)."""

    def __init__(self, default_repo: str = "", materializer: Materializer | None = None):
        self.default_repo = default_repo
        self._materializer = materializer

    @property
    def materializes(self) -> bool:
        return self._materializer is not None

    def keep_fresh(self, owner: str, needs: list[StoreNeed]) -> list[StoreState]:
        """Keep these stores materialised for the owner (none: let go of
        them); the states of those it needs, as they are now."""
        if self._materializer is None:
            return []
        self._materializer.want(owner, needs)
        return self._materializer.states({n.store for n in needs}) if needs else []

    def forget(self, owner: str) -> None:
        if self._materializer is not None:
            self._materializer.forget(owner)

    def states(self) -> list[StoreState]:
        return self._materializer.states() if self._materializer is not None else []

    def stop(self) -> None:
        if self._materializer is not None:
            self._materializer.stop()
