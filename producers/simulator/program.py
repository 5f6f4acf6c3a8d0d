"""What one rank runs in one training step: functions, kernels, collectives.

Durations are for an H100-class GPU and a model sized so that a step takes
about 0.7-1.5 s. One kernel record stands for one execution of a (large,
fused) kernel of that name; the same kernel name may appear several times in a
step with different shapes, as in real traces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import SimConfig

MS = 1_000_000.0
GiB = 1 << 30

ROOT = "train.py:main;train.py:train_step"
STACK_FWD = ROOT + ";model.py:forward"
STACK_BWD = ROOT + ";torch/_tensor.py:backward"
STACK_PIPE = ROOT + ";megatron/core/pipeline_parallel/schedules.py:forward_backward_pipelining_without_interleaving"
STACK_DL = ROOT + ";torch/utils/data/dataloader.py:__next__"
STACK_LOG = ROOT + ";train.py:log_metrics"
STACK_CLIP = ROOT + ";torch/nn/utils/clip_grad.py:clip_grad_norm_"
STACK_OPT = ROOT + ";torch/optim/adam.py:step"

GEMM_TN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_NN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_NT = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
TP_ALLREDUCE = "ncclKernel_AllReduce_RING_LL128_Sum_bf16"
DP_REDUCE_SCATTER = "ncclKernel_ReduceScatter_RING_LL128_Sum_f32"
DP_ALLGATHER = "ncclKernel_AllGather_RING_LL128_bf16"
WORLD_ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_f32"
PP_SEND = "ncclKernel_SendRecv_send_bf16"
PP_RECV = "ncclKernel_SendRecv_recv_bf16"
L2NORM = "multi_tensor_apply_kernel<L2NormFunctor>"
ADAM = "multi_tensor_apply_kernel<AdamFunctor>"
DATALOADER = "DataLoader.__next__"
H2D = "Memcpy HtoD"
D2H = "Memcpy DtoH"

# stream ids
S_COMPUTE, S_TP, S_DP, S_PP = 7, 21, 25, 29

# per kernel class: (memory-bandwidth share while running, board power while running [W])
CLASS_MEM = {"gemm": 0.35, "attn": 0.55, "mem": 0.85, "comm": 0.15, "copy": 0.05}
CLASS_POWER = {"gemm": 690.0, "attn": 650.0, "mem": 480.0, "comm": 300.0, "copy": 120.0}

HOST_FWD = 0.30  # host launch time / GPU time, forward (Python modules)
HOST_BWD = 0.15  # backward (autograd engine, C++)


class Op:
    """One function in a rank's step program.

    tag: kernel | memcpy | coll | send | recv | host | frame.
    """

    __slots__ = ("tag", "fn", "kind", "cls", "gpu_ns", "host_ns", "nbytes", "op", "family",
                 "stream", "stack", "tmpl", "sync")

    def __init__(self, tag, fn, kind, cls=None, gpu_ms=0.0, host_ms=0.0, nbytes=0, op=None,
                 family=None, stream=None, stack=None, sync=False):
        self.tag, self.fn, self.kind, self.cls = tag, fn, kind, cls
        self.gpu_ns, self.host_ns = gpu_ms * MS, host_ms * MS
        self.nbytes, self.op, self.family, self.stream, self.stack = int(nbytes), op, family, stream, stack
        self.sync = sync
        self.tmpl = None

    def __repr__(self) -> str:
        return f"Op({self.tag}, {self.fn})"


def K(fn: str, cls: str, ms: float, host_ratio: float, scale: float = 1.0) -> Op:
    return Op("kernel", fn, "kernel", cls, ms * scale, ms * scale * host_ratio, stream=S_COMPUTE)


def tp_allreduce(scale: float = 1.0) -> Op:
    return Op("coll", TP_ALLREDUCE, "collective", "comm", host_ms=0.3, nbytes=2 * GiB * scale,
              op="all_reduce", family="tp", stream=S_TP)


def frame(fn: str, stack: str, kind: str = "python") -> Op:
    return Op("frame", fn, kind, stack=stack)


def forward_ops(cfg: "SimConfig", stage: int) -> list[Op]:
    """Kernels of one forward pass (one microbatch when pipelined) on a rank of ``stage``."""
    first, last, tp = stage == 0, stage == cfg.pp - 1, cfg.tp_size > 1
    h = HOST_FWD
    ops: list[Op] = []
    if cfg.pp == 1:
        if first:
            ops.append(K("indexSelectLargeIndex", "mem", 3.0, h))
        ops += [K("layer_norm_kernel", "mem", 5.0, h), K(GEMM_TN, "gemm", 30.0, h),
                K("flash_fwd_kernel", "attn", 28.0, h), K(GEMM_TN, "gemm", 12.0, h)]
        if tp:
            ops.append(tp_allreduce())
        ops += [K("layer_norm_kernel", "mem", 5.0, h), K(GEMM_TN, "gemm", 45.0, h),
                K("vectorized_elementwise_kernel", "mem", 8.0, h), K(GEMM_TN, "gemm", 45.0, h)]
        if tp:
            ops.append(tp_allreduce())
        if last:
            ops.append(K("softmax_warp_forward", "mem", 6.0, h))
        return ops
    s = 1.0 / cfg.mb
    if first:
        ops.append(K("indexSelectLargeIndex", "mem", 3.0, h, s))
    ops += [K("layer_norm_kernel", "mem", 6.0, h, s), K(GEMM_TN, "gemm", 80.0, h, s),
            K("flash_fwd_kernel", "attn", 35.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    ops += [K(GEMM_TN, "gemm", 75.0, h, s), K("vectorized_elementwise_kernel", "mem", 10.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    if last:
        ops.append(K("softmax_warp_forward", "mem", 6.0, h, s))
    return ops


def backward_ops(cfg: "SimConfig", stage: int) -> list[Op]:
    last, tp = stage == cfg.pp - 1, cfg.tp_size > 1
    h = HOST_BWD
    ops: list[Op] = []
    if cfg.pp == 1:
        if last:
            ops.append(K("softmax_warp_backward", "mem", 6.0, h))
        ops += [K(GEMM_NN, "gemm", 45.0, h), K(GEMM_NT, "gemm", 45.0, h),
                K("vectorized_elementwise_kernel", "mem", 10.0, h), K(GEMM_NN, "gemm", 45.0, h),
                K(GEMM_NT, "gemm", 45.0, h)]
        if tp:
            ops.append(tp_allreduce())
        ops += [K("layer_norm_grad_input_kernel", "mem", 8.0, h), K("flash_bwd_kernel", "attn", 60.0, h),
                K(GEMM_NN, "gemm", 30.0, h), K(GEMM_NT, "gemm", 30.0, h)]
        if tp:
            ops.append(tp_allreduce())
        return ops
    s = 1.0 / cfg.mb
    if last:
        ops.append(K("softmax_warp_backward", "mem", 6.0, h, s))
    ops += [K(GEMM_NN, "gemm", 110.0, h, s), K(GEMM_NT, "gemm", 110.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    ops += [K("flash_bwd_kernel", "attn", 70.0, h, s), K("vectorized_elementwise_kernel", "mem", 10.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    return ops


class Program:
    """All ops of a step for every stage; Op objects are shared and immutable."""

    def __init__(self, cfg: "SimConfig"):
        self.cfg = cfg
        dp, world, pp = cfg.dp, cfg.world, cfg.pp
        self.train_step = frame("train_step", ROOT)
        self.log = Op("host", "log_metrics", "python", stack=STACK_LOG)
        self.gc = Op("host", "gc.collect", "python", stack=(STACK_FWD if pp == 1 else STACK_PIPE) + ";gc.collect")
        self.dataloader = Op("host", DATALOADER, "dataloader", host_ms=6.0, stack=STACK_DL)
        self.h2d = Op("memcpy", H2D, "memcpy", "copy", host_ms=0.2, nbytes=256 * (1 << 20), stream=S_COMPUTE)
        self.fwd_frame = frame("model.forward", STACK_FWD)
        self.bwd_frame = frame("model.backward", STACK_BWD)
        self.pipe_frame = frame("forward_backward_pipelining", STACK_PIPE)
        self.fwd = [forward_ops(cfg, s) for s in range(pp)]
        self.bwd = [backward_ops(cfg, s) for s in range(pp)]
        act = GiB * 1.0 / cfg.mb
        self.send_f = Op("send", PP_SEND, "collective", "comm", host_ms=0.2, nbytes=act, op="send", family="pp", stream=S_PP)
        self.recv_f = Op("recv", PP_RECV, "collective", "comm", host_ms=0.2, nbytes=act, op="recv", family="pp", stream=S_PP)
        self.send_b = self.send_f
        self.recv_b = self.recv_f
        self.rs = (Op("coll", DP_REDUCE_SCATTER, "collective", "comm", host_ms=0.3, nbytes=4 * GiB,
                      op="reduce_scatter", family="dp", stream=S_DP) if dp > 1 else None)
        self.ag = (Op("coll", DP_ALLGATHER, "collective", "comm", host_ms=0.3, nbytes=2 * GiB,
                      op="all_gather", family="dp", stream=S_DP) if dp > 1 else None)
        self.clip_frame = frame("clip_grad_norm_", STACK_CLIP)
        self.l2norm = K(L2NORM, "mem", 2.0, 0.5)
        self.world_ar = (Op("coll", WORLD_ALLREDUCE, "collective", "comm", host_ms=0.1, nbytes=4,
                            op="all_reduce", family="world", stream=S_DP) if world > 1 else None)
        self.opt_frame = frame("optimizer.step", STACK_OPT, kind="optimizer")
        self.opt_host = 4.0 * MS
        self.clip_host = 1.5 * MS
        self.adam = K(ADAM, "mem", 22.0, 0.05)
        self.d2h = Op("memcpy", D2H, "memcpy", "copy", gpu_ms=0.02, host_ms=0.05, nbytes=4, stream=S_COMPUTE, sync=True)

    def kernel_names(self) -> set[str]:
        names = {self.l2norm.fn, self.adam.fn}
        for ops in self.fwd + self.bwd:
            names.update(o.fn for o in ops if o.tag == "kernel")
        return names

    def stage_fns(self, stage: int) -> set[str]:
        names = {self.l2norm.fn, self.adam.fn, DATALOADER, H2D}
        names.update(o.fn for o in self.fwd[stage] + self.bwd[stage] if o.tag == "kernel")
        return names


def kernel_names(cfg: "SimConfig") -> set[str]:
    return Program(cfg).kernel_names()


def hang_targets(cfg: "SimConfig", rank: int) -> set[str]:
    stage = rank // (cfg.tp_size * cfg.dp)
    return Program(cfg).stage_fns(stage)


DEFAULT_HANG_FN = GEMM_NN
