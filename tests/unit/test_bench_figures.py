"""`make bench`'s repeated figures and its BLAS settings (pure, local)."""

from __future__ import annotations

import pytest

from tests.bench import blas
from tests.bench.repeat import Figure, figures, repeat


def test_a_figure_is_the_median_of_its_runs_and_a_wide_spread_is_flagged():
    steady = Figure("x", [1.00, 1.02, 0.98, 1.01, 0.99])
    noisy = Figure("y", [1.0, 1.3, 0.9, 1.0, 1.1])
    assert steady.median == pytest.approx(1.0) and steady.spread == pytest.approx(0.04) and not steady.flagged
    assert noisy.flagged and noisy.to_json()["flagged"] and noisy.to_json()["runs"] == noisy.values


def test_repeat_runs_in_order_and_figures_gathers_each_key():
    runs = repeat(lambda i: {"a": i, "b": 2 * i})
    assert [r["a"] for r in runs] == [0, 1, 2, 3, 4]
    a, b = figures(runs, {"a": "s", "b": "x"})
    assert (a.name, a.unit, a.median, b.median) == ("a", "s", 2.0, 4.0)


@pytest.mark.parametrize(("flags", "kernel"), [("fpu avx avx2 fma", "Haswell"), ("avx avx512f avx2", "SkylakeX"),
                                               ("fpu sse2", None)])
def test_the_openblas_kernel_follows_the_cpu_flags(flags, kernel):
    chosen = blas.choose(f"processor\t: 0\nflags\t\t: {flags}\n", "512K\n")
    assert chosen.get("OPENBLAS_CORETYPE") == kernel
    assert chosen["OPENBLAS_L2_SIZE"] == str(512 * 1024)


def test_no_cache_size_sets_no_l2_size():
    assert "OPENBLAS_L2_SIZE" not in blas.choose("flags : avx2\n", "")
