"""GPU requests of training jobs."""

from __future__ import annotations

from pydantic import Field

from kubeloop.api.base import KubeModel


class GPURequest(KubeModel):
    """Whole GPUs for a training process group."""

    count: int = Field(default=1, ge=0, le=16)
    """GPUs per node (nvidia.com/gpu)."""
    product: str | None = Field(default=None, max_length=128)
    """Pin a GPU product by its nvidia.com/gpu.product label, for example
    NVIDIA-A100-SXM4-40GB; becomes a node selector and the KFP accelerator type."""
