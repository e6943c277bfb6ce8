"""Does one replica fit its GPUs? Weights plus the KV cache of one longest sequence, per GPU.

An engine refuses to start when its GPUs cannot hold the weights and a KV cache for at least one
sequence of its maximum length (vLLM: "the model's max seq len is larger than the maximum number
of tokens that can be stored in KV cache"; SGLang: "not enough memory"). This is that check, done
before a pod exists, for the operator (condition Ready=False, reason ReplicaDoesNotFit) and for
`xpyd plan`, from the model catalog and the GPU table.

Per GPU of a replica with tensor-parallel size tp and data-parallel size dp:
- weights: every rank holds 1/tp of the dense weights; with expert parallelism the routed experts
  are spread over all tp x dp ranks, else each data-parallel rank holds its own copy;
- KV cache: one sequence of max_model_len tokens per data-parallel rank, split over its tp ranks
  by heads (MLA's latent cache is not split: every rank holds all of it);
- usable: the GPU's HBM x the engine's memory utilization (vLLM's --gpu-memory-utilization 0.9).
"""

from __future__ import annotations

from dataclasses import dataclass

from xpyd_perf.hardware import GpuSpec
from xpyd_perf.models import ModelSpec

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization (SGLang's --mem-fraction-static is close)


@dataclass(frozen=True, slots=True)
class Fit:
    """The numbers behind one verdict; `summary()` is the line conditions and `xpyd plan` print."""

    model: str
    weight_dtype: str
    gpu: str
    tp: int
    dp: int
    expert_parallel: bool
    max_model_len: int
    weight_bytes: float  # the whole checkpoint
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float  # one max_model_len sequence per data-parallel rank
    hbm_bytes_per_gpu: float
    memory_utilization: float
    kv_bytes_per_token: int

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def usable_bytes_per_gpu(self) -> float:
        return self.hbm_bytes_per_gpu * self.memory_utilization

    @property
    def need_bytes_per_gpu(self) -> float:
        return self.weight_bytes_per_gpu + self.kv_bytes_per_gpu

    @property
    def fits(self) -> bool:
        return self.need_bytes_per_gpu <= self.usable_bytes_per_gpu

    @property
    def kv_room_bytes_per_gpu(self) -> float:
        """HBM left for the KV cache on each GPU after the weights (0 when the weights do not fit)."""
        return max(0.0, self.usable_bytes_per_gpu - self.weight_bytes_per_gpu)

    def layout(self) -> str:
        parallel = f"TP{self.tp}" + (f" x DP{self.dp}" + (" EP" if self.expert_parallel else "") if self.dp > 1 else "")
        return f"{self.gpus} x {self.gpu} ({parallel})"

    def summary(self) -> str:
        gb = 1e9
        head = (
            f"{self.model} ({self.weight_bytes / gb:.0f} GB of {self.weight_dtype} weights) on {self.layout()}: "
            f"{self.weight_bytes_per_gpu / gb:.1f} GB of weights + {self.kv_bytes_per_gpu / gb:.1f} GB of KV cache "
            f"for one {self.max_model_len}-token sequence = {self.need_bytes_per_gpu / gb:.1f} GB per GPU"
        )
        usable = (
            f"{self.usable_bytes_per_gpu / gb:.1f} GB usable "
            f"({self.memory_utilization:g} x {self.hbm_bytes_per_gpu / gb:.0f} GB HBM)"
        )
        if self.fits:
            return f"{head} <= {usable}: fits"
        return (
            f"{head} > {usable}: does not fit; use more GPUs per replica, a smaller --max-model-len "
            "or a quantized checkpoint (FP8, FP4)"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "weight_dtype": self.weight_dtype,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "tp": self.tp,
            "dp": self.dp,
            "expert_parallel": self.expert_parallel,
            "max_model_len": self.max_model_len,
            "weight_bytes": self.weight_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_bytes_per_gpu": self.kv_bytes_per_gpu,
            "need_bytes_per_gpu": self.need_bytes_per_gpu,
            "usable_bytes_per_gpu": self.usable_bytes_per_gpu,
            "fits": self.fits,
            "summary": self.summary(),
        }


def replica_fit(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    dp: int = 1,
    expert_parallel: bool = False,
    max_model_len: int | None = None,
    kv_bytes_per_token: int | None = None,
    memory_utilization: float = GPU_MEMORY_UTILIZATION,
) -> Fit:
    """Whether one replica of `model` on tp x dp GPUs holds its weights and one longest sequence.

    `max_model_len` defaults to the model's context length (what the engine assumes without
    --max-model-len); `kv_bytes_per_token` overrides the catalog (e.g. half for an FP8 KV cache).
    """
    if tp < 1 or dp < 1:
        raise ValueError(f"tensor- and data-parallel sizes must be >= 1, got tp={tp} dp={dp}")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory utilization must lie in (0, 1], got {memory_utilization}")
    tokens = max_model_len or model.max_model_len
    per_token = kv_bytes_per_token if kv_bytes_per_token is not None else model.kv_bytes_per_token
    bpp = model.weight_bytes_per_param
    experts = model.expert_params
    dense = model.params - experts
    spread = tp * dp if expert_parallel else tp
    weights = (dense / tp + experts / spread) * bpp
    kv = tokens * per_token / (1 if model.mla else tp)
    return Fit(
        model=model.key,
        weight_dtype=model.weight_dtype,
        gpu=gpu.name,
        tp=tp,
        dp=dp,
        expert_parallel=expert_parallel,
        max_model_len=tokens,
        weight_bytes=model.weight_bytes,
        weight_bytes_per_gpu=weights,
        kv_bytes_per_gpu=kv,
        hbm_bytes_per_gpu=gpu.hbm_bytes,
        memory_utilization=memory_utilization,
        kv_bytes_per_token=per_token,
    )
