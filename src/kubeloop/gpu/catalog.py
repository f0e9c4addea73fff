"""What kubeloop knows about NVIDIA GPUs: products by their GPU Feature
Discovery label, their memory, and the MIG profiles each one offers.

Product names are the values GFD writes into nvidia.com/gpu.product (the NVML
name with spaces turned into dashes). MIG memory figures are the MiB that GFD
reports in nvidia.com/mig-<profile>.memory where NVIDIA documents them, and
the GiB that `nvidia-smi mig -lgip` lists times 1024 elsewhere. Placements are
`nvidia-smi mig -lgipp`'s start slots, in memory slices.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile, such as 3g.40gb."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    starts: tuple[int, ...]
    """Memory slices at which an instance of this profile may start."""

    @property
    def max_per_gpu(self) -> int:
        return len(self.starts)

    @property
    def resource(self) -> str:
        """The extended resource the device plugin advertises (mixed strategy)."""
        return f"nvidia.com/mig-{self.name}"


@dataclass(frozen=True)
class GpuModel:
    """One GPU product."""

    product: str
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_profiles: tuple[MigProfile, ...] = ()
    compute_slices: int = 7
    memory_slices: int = 8

    @property
    def family(self) -> str:
        major, minor = self.compute_capability
        if major >= 9:
            return "hopper"
        if (major, minor) == (8, 9):
            return "ada-lovelace"
        if major == 8:
            return "ampere"
        return "turing" if (major, minor) == (7, 5) else "volta"

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def supports_sparsity_2to4(self) -> bool:
        """Sparse tensor cores (2:4 structured sparsity) arrived with Ampere."""
        return self.compute_capability >= (8, 0)

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    def smallest_profile(self, need_mib: int, wanted: str = "auto") -> MigProfile | None:
        """The MIG profile with the fewest slices that holds need_mib (wanted:
        "auto" or one profile's name); None when none does."""
        fitting = [p for p in self.mig_profiles if p.memory_mib >= need_mib and wanted in ("auto", p.name)]
        return min(fitting, key=lambda p: (p.compute_slices, p.memory_slices), default=None)


def _profiles(*rows: tuple[str, int, int, int, tuple[int, ...]]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(*row) for row in rows)


# Placements shared by the 7-slice GPUs (A100, H100, H200).
_ONE = (0, 1, 2, 3, 4, 5, 6)
_ONE_DOUBLE = (0, 2, 4, 6)
_TWO = (0, 2, 4)
_THREE = (0, 4)
_WHOLE = (0,)

GPUS: tuple[GpuModel, ...] = (
    GpuModel("NVIDIA-A100-SXM4-40GB", 40960, (8, 0), _profiles(
        ("1g.5gb", 1, 1, 4864, _ONE),
        ("1g.10gb", 1, 2, 9984, _ONE_DOUBLE),
        ("2g.10gb", 2, 2, 9984, _TWO),
        ("3g.20gb", 3, 4, 20096, _THREE),
        ("4g.20gb", 4, 4, 20096, _WHOLE),
        ("7g.40gb", 7, 8, 40320, _WHOLE),
    )),
    GpuModel("NVIDIA-A100-SXM4-80GB", 81920, (8, 0), _profiles(
        ("1g.10gb", 1, 1, 9728, _ONE),
        ("1g.20gb", 1, 2, 19968, _ONE_DOUBLE),
        ("2g.20gb", 2, 2, 19968, _TWO),
        ("3g.40gb", 3, 4, 40192, _THREE),
        ("4g.40gb", 4, 4, 40192, _WHOLE),
        ("7g.80gb", 7, 8, 80384, _WHOLE),
    )),
    GpuModel("NVIDIA-H100-80GB-HBM3", 81559, (9, 0), _profiles(
        ("1g.10gb", 1, 1, 9984, _ONE),
        ("1g.20gb", 1, 2, 20096, _ONE_DOUBLE),
        ("2g.20gb", 2, 2, 20096, _TWO),
        ("3g.40gb", 3, 4, 40320, _THREE),
        ("4g.40gb", 4, 4, 40320, _WHOLE),
        ("7g.80gb", 7, 8, 81152, _WHOLE),
    )),
    GpuModel("NVIDIA-H100-NVL", 95830, (9, 0), _profiles(
        ("1g.12gb", 1, 1, 11264, _ONE),
        ("1g.24gb", 1, 2, 22784, _ONE_DOUBLE),
        ("2g.24gb", 2, 2, 22784, _TWO),
        ("3g.47gb", 3, 4, 46464, _THREE),
        ("4g.47gb", 4, 4, 46464, _WHOLE),
        ("7g.94gb", 7, 8, 93184, _WHOLE),
    )),
    # H200 (141 GB): the profiles and instance counts of NVIDIA's MIG guide and
    # mig-parted's H200-141GB configurations, on the Hopper slots above. No
    # per-profile MiB figure was at hand here, so each is the floor of its
    # name (GB x 10^9 bytes in MiB): a lower bound of what the device has, so
    # kubeloop never calls a model fitting that does not.
    GpuModel("NVIDIA-H200", 143771, (9, 0), _profiles(
        ("1g.18gb", 1, 1, 17166, _ONE),
        ("1g.35gb", 1, 2, 33378, _ONE_DOUBLE),
        ("2g.35gb", 2, 2, 33378, _TWO),
        ("3g.71gb", 3, 4, 67711, _THREE),
        ("4g.71gb", 4, 4, 67711, _WHOLE),
        ("7g.141gb", 7, 8, 134468, _WHOLE),
    )),
    GpuModel("NVIDIA-A30", 24576, (8, 0), _profiles(
        ("1g.6gb", 1, 1, 5836, (0, 1, 2, 3)),
        ("2g.12gb", 2, 2, 11904, (0, 2)),
        ("4g.24gb", 4, 4, 24064, (0,)),
    ), compute_slices=4, memory_slices=4),
    GpuModel("NVIDIA-L40S", 46068, (8, 9)),
    GpuModel("NVIDIA-L4", 23034, (8, 9)),
    GpuModel("NVIDIA-A10G", 23028, (8, 6)),
    GpuModel("Tesla-T4", 15360, (7, 5)),
)

_BY_PRODUCT = {gpu.product: gpu for gpu in GPUS}


def gpu_model(product: str) -> GpuModel | None:
    """The catalogue entry for a product label, also for the suffixed forms
    GFD writes under MIG single strategy (-MIG-1g.5gb) and sharing (-SHARED)."""
    base = product.removesuffix("-SHARED").split("-MIG-")[0]
    return _BY_PRODUCT.get(base)


def all_mig_profile_names() -> list[str]:
    return sorted({p.name for gpu in GPUS for p in gpu.mig_profiles}, key=_profile_order)


def _profile_order(name: str) -> tuple[int, int, str]:
    compute, memory = name.split(".", 1)
    return int(compute.rstrip("g")), int(memory.rstrip("gb").split("+")[0]), name


def mig_profile_rule() -> tuple[str, str, str, str]:
    """A CEL rule for a ServingGPU: the MIG profile exists, and exists for the
    named product. Generated from the catalogue so the two never disagree."""
    # Here, not at the top: the catalogue itself stays free of pydantic (the
    # GPU benchmark reads it on a machine that holds only torch).
    from kubeloop.api.schema import cel_list

    by_product = ", ".join(
        f"'{gpu.product}': {cel_list(p.name for p in gpu.mig_profiles)}"
        for gpu in GPUS if gpu.mig_profiles
    )
    rule = (
        "!has(self.mig) || self.mig.profile == 'auto' || "
        f"(has(self.product) ? (self.product in {{{by_product}}} && "
        f"self.mig.profile in {{{by_product}}}[self.product]) : "
        f"self.mig.profile in {cel_list(all_mig_profile_names())})"
    )
    message = (
        "mig.profile must be auto or a MIG profile of the GPU product (for example 1g.10gb "
        "on NVIDIA-H100-80GB-HBM3, 1g.5gb on NVIDIA-A100-SXM4-40GB); see `kubeloop gpus`"
    )
    message_expression = (
        "'MIG profile ' + self.mig.profile + ' does not exist' + "
        "(has(self.product) ? ' on ' + self.product : ' on any GPU kubeloop knows') + "
        "'; use auto or a profile that `kubeloop gpus` lists'"
    )
    return rule, message, "mig.profile", message_expression
