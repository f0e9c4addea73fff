"""A seeded generator of card-transaction data for the Feast repository.

No dataset can be downloaded here, so the data is simulated: cards and
merchants, transactions with event timestamps and a fraud label, and the
feature snapshots a real pipeline would compute from them (per card every
day, per merchant every week). Snapshots only use data from before their
timestamp, so point-in-time joins are leak-free.

`drift` (0 = the reference world) moves both the inputs and the label's
relation to them: larger amounts, more online and night-time spending, more
fraud at risky merchants and through contactless payments. A model trained
on drift=0 data is measurably worse on drift=1 data, which is what the
monitoring loop has to notice.

`concept` moves only the label's relation to the inputs (concept drift):
the inputs keep the reference world's distribution while fraud leaves
night-time online payments for contactless ones at risky merchants. Input
drift checks see nothing; only the labels, when they arrive, tell.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

CATEGORIES = ("grocery", "fuel", "restaurants", "electronics", "travel", "gaming", "marketplace")
CATEGORY_RISK = np.array([0.4, 0.6, 0.5, 1.6, 1.3, 2.0, 1.4])
CHANNELS = ("in_store", "online", "contactless")
WARMUP_DAYS = 30
"""Simulated history before a scenario's first day (the longest feature window)."""


@dataclass(frozen=True)
class Scenario:
    """What to simulate."""

    start: datetime
    days: int = 45
    cards: int = 2000
    merchants: int = 250
    transactions_per_card_day: float = 0.7
    drift: float = 0.0
    concept: float = 0.0
    """Concept drift: how far the label's relation to the inputs moves while
    the inputs stay where drift puts them."""
    seed: int = 7
    snapshot_at_end: bool = False
    """Also compute every feature snapshot at the period's end, as a feature
    pipeline that runs at that moment would (not only at midnights and
    weekly): a period that ends now then has values newer than anything
    materialised, which Feast's incremental materialisation loads."""

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)


def default_start(days: int, now: datetime | None = None) -> datetime:
    """A window that ends today at midnight UTC, so materialisation has fresh data."""
    today = (now or datetime.now(timezone.utc)).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days)


def simulate(s: Scenario) -> dict[str, pd.DataFrame]:
    """All tables of the scenario (pure, deterministic for a seed).

    The world runs for WARMUP_DAYS before the scenario starts: its
    transactions are not in the tables, but the first feature snapshots
    aggregate them, so a 30-day statistic on the first day is as complete as
    on the last and the features are stationary unless drift moves them.
    """
    rng = np.random.default_rng(s.seed)
    cards = _cards(s, rng)
    merchants = _merchants(s, rng)
    history = _transactions(replace(s, start=s.start - timedelta(days=WARMUP_DAYS), days=s.days + WARMUP_DAYS),
                            rng, cards, merchants)
    transactions = history[history["event_timestamp"] >= pd.Timestamp(s.start)].reset_index(drop=True)
    transactions["transaction_id"] = np.arange(1, len(transactions) + 1, dtype=np.int64)
    return {
        "cards": cards,
        "merchants": merchants,
        "transactions": transactions,
        "card_activity": _card_activity(s, history),
        "merchant_risk": _merchant_risk(s, history, merchants),
        # The card system's export of its attributes the day before the period, not the day each card was
        # opened: a profile older than the view's ttl is never materialised (Feast's first incremental
        # run starts a ttl before now), and the oldest cards' payments were served a credit limit of 0.
        "card_profile": cards[["card_id", "credit_limit", "account_age_days", "is_credit"]].assign(
            event_timestamp=pd.Timestamp(s.start) - pd.Timedelta(days=1)),
    }


def write(s: Scenario, data_dir: Path) -> dict[str, int]:
    """Write the feature sources as parquet; returns row counts per table."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tables = simulate(s)
    counts = {}
    for name in ("transactions", "card_activity", "merchant_risk", "card_profile"):
        tables[name].to_parquet(data_dir / f"{name}.parquet", index=False)
        counts[name] = len(tables[name])
    return counts


def _cards(s: Scenario, rng: np.random.Generator) -> pd.DataFrame:
    n = s.cards
    age = rng.gamma(2.0, 400.0, n).astype(np.int64) + 10
    opened = [s.start - timedelta(days=int(a)) for a in age]
    return pd.DataFrame({
        "card_id": np.arange(1, n + 1, dtype=np.int64),
        "credit_limit": np.round(rng.lognormal(8.2, 0.5, n), 2).astype(np.float32),
        "account_age_days": age,
        "is_credit": (rng.random(n) < 0.6).astype(np.int64),
        "typical_amount": rng.lognormal(3.6, 0.6, n),
        "online_affinity": rng.beta(2, 5, n),
        "event_timestamp": pd.to_datetime(opened, utc=True),
    })


def _merchants(s: Scenario, rng: np.random.Generator) -> pd.DataFrame:
    n = s.merchants
    weights = np.array([0.25, 0.15, 0.2, 0.1, 0.08, 0.07, 0.15])
    category = rng.choice(len(CATEGORIES), n, p=weights)
    return pd.DataFrame({
        "merchant_id": np.arange(1, n + 1, dtype=np.int64),
        "category": category,
        "base_risk": CATEGORY_RISK[category] * rng.lognormal(0, 0.5, n),
    })


def _transactions(s: Scenario, rng: np.random.Generator, cards: pd.DataFrame, merchants: pd.DataFrame) -> pd.DataFrame:
    d = s.drift
    n = int(s.cards * s.days * s.transactions_per_card_day)
    card_idx = rng.integers(0, s.cards, n)
    # Drift moves spending towards risky categories.
    risk_pref = merchants["base_risk"].to_numpy() ** d
    merchant_idx = rng.choice(s.merchants, n, p=risk_pref / risk_pref.sum())
    seconds = np.sort(rng.random(n)) * s.days * 86400
    timestamps = pd.Timestamp(s.start) + pd.to_timedelta(seconds, unit="s")
    hour = timestamps.hour.to_numpy()
    affinity = cards["online_affinity"].to_numpy()[card_idx]
    p_online = np.clip(affinity + 0.25 * d, 0, 0.95)
    u = rng.random(n)
    channel = np.where(u < p_online, 1, np.where(u < p_online + 0.3 * (1 - p_online), 2, 0))
    typical = cards["typical_amount"].to_numpy()[card_idx]
    spike = rng.random(n) < 0.04 + 0.06 * d
    amount = typical * rng.lognormal(0.0, 0.5, n) * np.where(spike, rng.uniform(3, 12, n), 1.0) * (1 + 0.8 * d)
    night = ((hour < 6) | (hour >= 23)).astype(float)
    age = cards["account_age_days"].to_numpy()[card_idx]
    risk = merchants["base_risk"].to_numpy()[merchant_idx]
    ratio = amount / typical
    logit = (
        -6.2
        + 1.9 * np.log1p(ratio)
        + 1.6 * night * (channel == 1)
        + 1.3 * np.log(risk)
        + 1.4 * (age < 90)
        + 0.6 * (channel == 1)
        # Under drift, fraud moves to contactless payments at risky merchants.
        + d * (1.8 * (channel == 2) * (risk > 1.2) - 0.5 * (channel == 1))
        # Under concept drift it moves there from night-time online payments, the inputs unchanged.
        + s.concept * (2.4 * (channel == 2) * (risk > 1.2) - 1.6 * night * (channel == 1) - 0.6 * (channel == 1))
        + rng.normal(0, 0.3, n)
    )
    is_fraud = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return pd.DataFrame({
        "transaction_id": np.arange(1, n + 1, dtype=np.int64),
        "card_id": cards["card_id"].to_numpy()[card_idx],
        "merchant_id": merchants["merchant_id"].to_numpy()[merchant_idx],
        "amount": np.round(amount, 2).astype(np.float64),
        "hour": hour.astype(np.int64),
        "channel": np.array(CHANNELS)[channel],
        "is_fraud": is_fraud,
        "event_timestamp": timestamps,
    })


def _snapshot_times(s: Scenario, every: str) -> pd.DatetimeIndex:
    """When a cadence's snapshots are computed: from the first midnight of the
    scenario, and at its end too when it asks for that."""
    times = pd.date_range(pd.Timestamp(s.start).ceil("D"), pd.Timestamp(s.end), freq=every)
    end = pd.Timestamp(s.end)
    if s.snapshot_at_end and (times.empty or times[-1] < end):
        times = times.append(pd.DatetimeIndex([end]))
    return times


def _card_activity(s: Scenario, tx: pd.DataFrame) -> pd.DataFrame:
    """Daily 7-day aggregates per card, only for cards active in the window
    (a dormant card has no fresh snapshot, so ttl can drop its rows).
    Snapshots start at the first midnight of the scenario, never inside the
    period before an appended one."""
    tx = tx.assign(day=tx["event_timestamp"].dt.floor("D"), online=(tx["channel"] == "online").astype(float))
    daily = tx.groupby(["card_id", "day"]).agg(
        n=("amount", "size"), total=("amount", "sum"), peak=("amount", "max"), online=("online", "sum"),
        merchants=("merchant_id", "nunique"),
    )
    frames = []
    for snapshot in _snapshot_times(s, "D"):
        window = daily.loc[(daily.index.get_level_values("day") >= snapshot - pd.Timedelta(days=7))
                           & (daily.index.get_level_values("day") < snapshot)]
        if window.empty:
            continue
        g = window.groupby(level="card_id").agg(
            txn_count_7d=("n", "sum"), total=("total", "sum"), max_amount_7d=("peak", "max"),
            online=("online", "sum"), distinct_merchants_7d=("merchants", "sum"))
        g["avg_amount_7d"] = g["total"] / g["txn_count_7d"]
        g["online_share_7d"] = g["online"] / g["txn_count_7d"]
        g["event_timestamp"] = snapshot
        frames.append(g.drop(columns=["total", "online"]).reset_index())
    out = pd.concat(frames, ignore_index=True)
    out["txn_count_7d"] = out["txn_count_7d"].astype(np.int64)
    out["distinct_merchants_7d"] = out["distinct_merchants_7d"].astype(np.int64)
    for col in ("avg_amount_7d", "max_amount_7d", "online_share_7d"):
        out[col] = out[col].astype(np.float32)
    return out


def _merchant_risk(s: Scenario, tx: pd.DataFrame, merchants: pd.DataFrame) -> pd.DataFrame:
    """Weekly 30-day merchant statistics from labels known by then."""
    frames = []
    for snapshot in _snapshot_times(s, "7D"):
        window = tx[(tx["event_timestamp"] >= snapshot - pd.Timedelta(days=30)) & (tx["event_timestamp"] < snapshot)]
        stats = window.groupby("merchant_id").agg(fraud_rate_30d=("is_fraud", "mean"),
                                                  avg_ticket_30d=("amount", "mean"),
                                                  txn_count_30d=("amount", "size"))
        base = merchants.set_index("merchant_id")
        stats = stats.reindex(base.index)
        # A prior from the merchant's category keeps new merchants scored.
        prior = 0.01 * CATEGORY_RISK[base["category"].to_numpy()]
        stats["fraud_rate_30d"] = stats["fraud_rate_30d"].fillna(pd.Series(prior, index=base.index))
        stats["avg_ticket_30d"] = stats["avg_ticket_30d"].fillna(50.0)
        stats["txn_count_30d"] = stats["txn_count_30d"].fillna(0)
        stats["category_risk"] = CATEGORY_RISK[base["category"].to_numpy()]
        stats["event_timestamp"] = snapshot
        frames.append(stats.reset_index())
    out = pd.concat(frames, ignore_index=True)
    out["txn_count_30d"] = out["txn_count_30d"].astype(np.int64)
    for col in ("fraud_rate_30d", "avg_ticket_30d", "category_risk"):
        out[col] = out[col].astype(np.float32)
    return out
