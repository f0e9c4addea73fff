"""The GPU catalogue and MIG geometry."""

from __future__ import annotations

import pytest

from kubeloop.gpu.catalog import GPUS, all_mig_profile_names, gpu_model
from kubeloop.gpu.mig import fits_on_one_gpu, place_on_one_gpu

H100 = gpu_model("NVIDIA-H100-80GB-HBM3")
A100 = gpu_model("NVIDIA-A100-SXM4-40GB")


def profiles(model, *names):
    return [model.profile(n) for n in names]


def test_product_lookup_understands_gfd_suffixes():
    assert gpu_model("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") is A100
    assert gpu_model("NVIDIA-L4-SHARED").product == "NVIDIA-L4"
    assert gpu_model("NVIDIA-B999") is None


def test_limits_per_gpu_match_nvidia_tables():
    assert {p.name: p.max_per_gpu for p in A100.mig_profiles} == {
        "1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
    assert {p.name: p.max_per_gpu for p in H100.mig_profiles} == {
        "1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}


@pytest.mark.parametrize("layout, fits", [
    (("1g.10gb",) * 7, True),
    (("1g.10gb",) * 8, False),                       # only 7 compute slices
    (("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), True),   # mig-parted all-balanced
    (("4g.40gb", "3g.40gb"), True),
    (("3g.40gb", "3g.40gb"), True),
    (("3g.40gb", "3g.40gb", "1g.10gb"), False),      # two 3g take all 8 memory slices
    (("3g.40gb", "3g.40gb", "2g.20gb"), False),      # 8 compute slices
    (("4g.40gb", "2g.20gb", "2g.20gb"), False),      # 2g cannot start at slot 6
    (("1g.20gb",) * 4, True),
    (("1g.20gb",) * 4 + ("1g.10gb",), False),        # all memory slices taken
    (("7g.80gb",), True),
    (("7g.80gb", "1g.10gb"), False),
])
def test_h100_layouts(layout, fits):
    assert fits_on_one_gpu(H100, profiles(H100, *layout)) is fits


def test_placement_starts_are_valid_and_disjoint():
    chosen = profiles(H100, "1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb")
    starts = place_on_one_gpu(H100, chosen)
    used = []
    for profile, start in zip(chosen, starts, strict=True):
        assert start in profile.starts
        used += list(range(start, start + profile.memory_slices))
    assert len(used) == len(set(used))


def test_profile_names_are_ordered_and_unique():
    names = all_mig_profile_names()
    assert names[0] == "1g.5gb" and "7g.94gb" in names and len(names) == len(set(names))
    assert all(gpu.memory_mib > 0 for gpu in GPUS)


def test_demand_is_packed_and_filled_into_mig_parted_layouts():
    from kubeloop.gpu.mig import config_name, mig_parted_config, pack

    balanced = pack(H100, 2, {"3g.40gb": 2, "2g.20gb": 2, "1g.10gb": 1})
    assert balanced == [{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}] * 2
    assert config_name(H100, balanced) == "all-balanced"
    small = pack(H100, 1, {"1g.10gb": 3})
    assert small == [{"1g.10gb": 7}] and config_name(H100, small) == "all-1g.10gb"
    custom = pack(H100, 1, {"4g.40gb": 1, "1g.20gb": 1}, fill=False)
    name = config_name(H100, custom)
    assert name.startswith("kubeloop-")
    assert mig_parted_config(name, custom)["mig-configs"][name][0]["mig-devices"] == {"1g.20gb": 1, "4g.40gb": 1}


def test_demand_that_cannot_fit_is_refused():
    from kubeloop.gpu.mig import LayoutError, pack

    with pytest.raises(LayoutError, match="do not fit"):
        pack(H100, 1, {"3g.40gb": 2, "2g.20gb": 1})


A100_40 = gpu_model("NVIDIA-A100-SXM4-40GB")
A100_80 = gpu_model("NVIDIA-A100-SXM4-80GB")
H100_NVL = gpu_model("NVIDIA-H100-NVL")
A30 = gpu_model("NVIDIA-A30")
H200 = gpu_model("NVIDIA-H200")


@pytest.mark.parametrize("model, layout, error", [
    (A100_40, {"1g.5gb": 7}, None),
    (A100_40, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}, None),           # mig-parted's all-balanced
    (A100_40, {"4g.20gb": 1, "3g.20gb": 1}, None),
    (A100_40, {"1g.10gb": 4}, None),
    (A100_40, {"1g.10gb": 4, "1g.5gb": 1}, "start slots collide"),       # memory slices all taken
    (A100_40, {"2g.10gb": 3, "1g.5gb": 2}, "compute slices"),            # 8 compute slices
    (A100_40, {"4g.20gb": 2}, "compute slices"),
    (A100_40, {"3g.20gb": 2, "1g.5gb": 1}, "start slots collide"),        # two 3g take all 8 memory slices
    (A100_40, {"1g.20gb": 1}, "no MIG profile"),                          # an 80GB profile
    (A100_80, {"3g.40gb": 2}, None),
    (A100_80, {"3g.40gb": 2, "1g.10gb": 1}, "start slots collide"),
    (A100_80, {"7g.80gb": 1}, None),
    (A100_80, {"7g.80gb": 1, "1g.10gb": 1}, "compute slices"),
    (H100, {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, None),
    (H100, {"3g.40gb": 1, "2g.20gb": 2}, None),                           # 3g at slot 4, the 2g at 0 and 2
    (H100, {"3g.40gb": 2, "1g.10gb": 1}, "start slots collide"),
    (H100_NVL, {"3g.47gb": 1, "2g.24gb": 1, "1g.12gb": 2}, None),
    (H100_NVL, {"1g.24gb": 4, "1g.12gb": 1}, "start slots collide"),
    (H200, {"1g.18gb": 7}, None),
    (H200, {"1g.35gb": 4}, None),
    (H200, {"2g.35gb": 3}, None),
    (H200, {"3g.71gb": 2}, None),
    (H200, {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}, None),            # as all-balanced elsewhere
    (H200, {"1g.35gb": 4, "1g.18gb": 1}, "start slots collide"),
    (H200, {"7g.141gb": 1, "1g.18gb": 1}, "compute slices"),
    (H200, {"3g.40gb": 1}, "no MIG profile"),                             # an H100 profile
    (A30, {"2g.12gb": 2}, None),
    (A30, {"4g.24gb": 1, "1g.6gb": 1}, "compute slices"),
    (A30, {"2g.12gb": 1, "1g.6gb": 2}, None),
])
def test_layouts_follow_nvidias_placement_rules(model, layout, error):
    """Unit: one GPU's MIG devices against the catalogue's slices and start
    slots (`nvidia-smi mig -lgipp`), per product."""
    from kubeloop.gpu.mig import layout_error

    found = layout_error(model, layout)
    assert (found is None) if error is None else (found is not None and error in found), found


@pytest.mark.parametrize("model", [m for m in GPUS if m.mig_profiles], ids=lambda m: m.product)
def test_every_standard_layout_kubeloop_may_advise_is_valid(model):
    from kubeloop.gpu.mig import layout_error, standard_configs

    for name, layout in standard_configs(model).items():
        assert layout_error(model, layout) is None, (name, layout)


def test_single_strategy_advice_is_homogeneous():
    """A node under the MIG single strategy slices every GPU one way: the
    advice is an all-<profile> layout whose profile holds every demanded
    instance, never all-balanced or a custom mix."""
    from kubeloop.gpu.mig import LayoutError, choose_layout

    name, layouts = choose_layout(A100_40, 2, {"1g.5gb": 2, "3g.20gb": 1}, "all-1g.5gb", homogeneous=True)
    assert name == "all-3g.20gb" and layouts == [{"3g.20gb": 2}] * 2
    mixed, _ = choose_layout(A100_40, 2, {"1g.5gb": 2, "3g.20gb": 1}, "all-1g.5gb")
    assert mixed == "all-balanced"  # what the mixed strategy may use
    assert choose_layout(A100_40, 1, {"1g.5gb": 5}, homogeneous=True)[0] == "all-1g.5gb"
    with pytest.raises(LayoutError, match="single strategy"):
        choose_layout(A100_40, 1, {"3g.20gb": 1, "1g.5gb": 2}, homogeneous=True)  # 3 instances, 2 per GPU


def test_smallest_profile_is_the_fewest_slices_that_hold_the_footprint():
    assert H100.smallest_profile(0).name == "1g.10gb"
    assert H100.smallest_profile(15000).name == "1g.20gb"
    assert H100.smallest_profile(15000, "2g.20gb").name == "2g.20gb"
    assert H100.smallest_profile(15000, "1g.10gb") is None
    assert H100.smallest_profile(H100.memory_mib) is None
