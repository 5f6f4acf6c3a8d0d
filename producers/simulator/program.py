"""What one rank runs in one training step: functions, kernels, collectives.

Durations are for an H100-class GPU and a model sized so that a step takes
about 0.7-1.5 s. One kernel record stands for one execution of a (large,
fused) kernel of that name; the same kernel name may appear several times in a
step with different shapes, as in real traces.
"""

from __future__ import annotations

from dataclasses import dataclass
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
STACK_PIPE_INTERLEAVED = (ROOT + ";megatron/core/pipeline_parallel/schedules.py:"
                          "forward_backward_pipelining_with_interleaving")
STACK_EVAL = "train.py:main;train.py:evaluate;model.py:forward"
STACK_CKPT = "train.py:main;megatron/training/checkpointing.py:save_checkpoint"

GEMM_TN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_NN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_NT = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
TP_ALLREDUCE = "ncclKernel_AllReduce_RING_LL128_Sum_bf16"
DP_REDUCE_SCATTER = "ncclKernel_ReduceScatter_RING_LL128_Sum_f32"
DP_ALLGATHER = "ncclKernel_AllGather_RING_LL128_bf16"
WORLD_ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_f32"
PP_SEND = "ncclKernel_SendRecv_send_bf16"
PP_RECV = "ncclKernel_SendRecv_recv_bf16"
FSDP_REDUCE_SCATTER = "ncclKernel_ReduceScatter_RING_LL128_Sum_bf16"
MOE_ROUTER = "topkGatingSoftmax"
MOE_FC1 = "cutlass_grouped_gemm_bf16_moe_fc1"
MOE_FC2 = "cutlass_grouped_gemm_bf16_moe_fc2"
MOE_DGRAD = "cutlass_grouped_gemm_bf16_moe_dgrad"
MOE_WGRAD = "cutlass_grouped_gemm_bf16_moe_wgrad"
MOE_EXPERT_KERNELS = (MOE_FC1, MOE_FC2, MOE_DGRAD, MOE_WGRAD)
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

# FSDP per transformer block and microbatch: the block's bf16 parameters gathered (forward and again in
# backward), its fp32-accumulated bf16 gradients reduce-scattered; the sizes match the ZeRO totals of the
# default program (2 GiB gathered, 4 GiB reduced per step) split over its two blocks.
FSDP_AG_BYTES = 1 * GiB
FSDP_RS_BYTES = 2 * GiB
MOE_ROUTER_MS = 1.5  # top-k gating softmax over the tokens of a microbatch: small next to the expert GEMMs


@dataclass(frozen=True)
class Variant:
    """Structure of the model and its parallelism beyond the layout (the realistic profile varies it).

    ``moe``: the MLP of each block is a mixture of experts (grouped expert GEMMs after a router).
    ``fsdp``: parameters sharded over the DP group (per-block all-gather / reduce-scatter) instead
    of the distributed optimizer's end-of-step reduce-scatter + all-gather.
    ``schedule`` (pp > 1): ``gpipe`` (all forwards, then all backwards), ``1f1b`` or
    ``interleaved`` (1F1B over ``chunks`` model chunks per stage, Megatron's virtual pipeline).
    """

    moe: bool = False
    fsdp: bool = False
    schedule: str = "gpipe"
    chunks: int = 1


DEFAULT_VARIANT = Variant()


class Op:
    """One function in a rank's step program.

    tag: kernel | memcpy | coll | send | recv | host | region (a span enclosing others: a Python function on the stack).
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


def region(fn: str, stack: str, kind: str = "python") -> Op:
    return Op("region", fn, kind, stack=stack)


def fsdp_allgather() -> Op:
    return Op("coll", DP_ALLGATHER, "collective", "comm", host_ms=0.3, nbytes=FSDP_AG_BYTES,
              op="all_gather", family="dp", stream=S_DP)


def fsdp_reduce_scatter() -> Op:
    return Op("coll", FSDP_REDUCE_SCATTER, "collective", "comm", host_ms=0.3, nbytes=FSDP_RS_BYTES,
              op="reduce_scatter", family="dp", stream=S_DP)


def forward_ops(cfg: "SimConfig", stage: int, v: Variant = DEFAULT_VARIANT, chunk: int = 0) -> list[Op]:
    """Kernels of one forward pass (one microbatch and model chunk when pipelined) on a rank of ``stage``."""
    first = stage == 0 and chunk == 0
    last, tp = stage == cfg.pp - 1 and chunk == v.chunks - 1, cfg.tp_size > 1
    fsdp = v.fsdp and cfg.dp > 1
    h = HOST_FWD
    ops: list[Op] = []
    if cfg.pp == 1:
        if first:
            ops.append(K("indexSelectLargeIndex", "mem", 3.0, h))
        if fsdp:
            ops.append(fsdp_allgather())
        ops += [K("layer_norm_kernel", "mem", 5.0, h), K(GEMM_TN, "gemm", 30.0, h),
                K("flash_fwd_kernel", "attn", 28.0, h), K(GEMM_TN, "gemm", 12.0, h)]
        if tp:
            ops.append(tp_allreduce())
        if fsdp:
            ops.append(fsdp_allgather())
        if v.moe:
            ops += [K("layer_norm_kernel", "mem", 5.0, h), K(MOE_ROUTER, "mem", MOE_ROUTER_MS, h),
                    K(MOE_FC1, "gemm", 45.0, h), K("vectorized_elementwise_kernel", "mem", 8.0, h),
                    K(MOE_FC2, "gemm", 45.0, h)]
        else:
            ops += [K("layer_norm_kernel", "mem", 5.0, h), K(GEMM_TN, "gemm", 45.0, h),
                    K("vectorized_elementwise_kernel", "mem", 8.0, h), K(GEMM_TN, "gemm", 45.0, h)]
        if tp:
            ops.append(tp_allreduce())
        if last:
            ops.append(K("softmax_warp_forward", "mem", 6.0, h))
        return ops
    s = 1.0 / (cfg.mb * v.chunks)
    if first:
        ops.append(K("indexSelectLargeIndex", "mem", 3.0, h, s))
    if fsdp:
        ops.append(fsdp_allgather())
    ops += [K("layer_norm_kernel", "mem", 6.0, h, s), K(GEMM_TN, "gemm", 80.0, h, s),
            K("flash_fwd_kernel", "attn", 35.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    if v.moe:
        ops += [K(MOE_ROUTER, "mem", MOE_ROUTER_MS, h, s), K(MOE_FC1, "gemm", 75.0, h, s)]
    else:
        ops.append(K(GEMM_TN, "gemm", 75.0, h, s))
    ops.append(K("vectorized_elementwise_kernel", "mem", 10.0, h, s))
    if tp:
        ops.append(tp_allreduce(s))
    if last:
        ops.append(K("softmax_warp_forward", "mem", 6.0, h, s))
    return ops


def backward_ops(cfg: "SimConfig", stage: int, v: Variant = DEFAULT_VARIANT, chunk: int = 0) -> list[Op]:
    last, tp = stage == cfg.pp - 1 and chunk == v.chunks - 1, cfg.tp_size > 1
    fsdp = v.fsdp and cfg.dp > 1
    dg, wg = (MOE_DGRAD, MOE_WGRAD) if v.moe else (GEMM_NN, GEMM_NT)
    h = HOST_BWD
    ops: list[Op] = []
    if cfg.pp == 1:
        if last:
            ops.append(K("softmax_warp_backward", "mem", 6.0, h))
        if fsdp:
            ops.append(fsdp_allgather())
        ops += [K(dg, "gemm", 45.0, h), K(wg, "gemm", 45.0, h),
                K("vectorized_elementwise_kernel", "mem", 10.0, h), K(dg, "gemm", 45.0, h),
                K(wg, "gemm", 45.0, h)]
        if tp:
            ops.append(tp_allreduce())
        if fsdp:
            ops += [fsdp_reduce_scatter(), fsdp_allgather()]
        ops += [K("layer_norm_grad_input_kernel", "mem", 8.0, h), K("flash_bwd_kernel", "attn", 60.0, h),
                K(GEMM_NN, "gemm", 30.0, h), K(GEMM_NT, "gemm", 30.0, h)]
        if tp:
            ops.append(tp_allreduce())
        if fsdp:
            ops.append(fsdp_reduce_scatter())
        return ops
    s = 1.0 / (cfg.mb * v.chunks)
    if last:
        ops.append(K("softmax_warp_backward", "mem", 6.0, h, s))
    if fsdp:
        ops.append(fsdp_allgather())
    ops += [K(dg, "gemm", 110.0, h, s), K(wg, "gemm", 110.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    ops += [K("flash_bwd_kernel", "attn", 70.0, h, s), K("vectorized_elementwise_kernel", "mem", 10.0, h, s)]
    if tp:
        ops.append(tp_allreduce(s))
    if fsdp:
        ops.append(fsdp_reduce_scatter())
    return ops


class Program:
    """All ops of a step for every stage; Op objects are shared and immutable (but for :meth:`scale`).

    ``variant``: the model structure; by default the one ``cfg`` implies (the realistic
    profile draws it from the seed, :func:`.realistic.variant_for`).
    """

    def __init__(self, cfg: "SimConfig", variant: Variant | None = None):
        self.cfg = cfg
        if variant is None:
            if cfg.realistic:
                from .realistic import variant_for
                variant = variant_for(cfg)
            else:
                variant = DEFAULT_VARIANT
        v = self.variant = variant
        dp, world, pp = cfg.dp, cfg.world, cfg.pp
        self.schedule = v.schedule if pp > 1 else "gpipe"
        self.train_step = region("train_step", ROOT)
        self.log = Op("host", "log_metrics", "python", stack=STACK_LOG)
        self.gc = Op("host", "gc.collect", "python", stack=(STACK_FWD if pp == 1 else STACK_PIPE) + ";gc.collect")
        self.dataloader = Op("host", DATALOADER, "dataloader", host_ms=6.0, stack=STACK_DL)
        self.h2d = Op("memcpy", H2D, "memcpy", "copy", host_ms=0.2, nbytes=256 * (1 << 20), stream=S_COMPUTE)
        self.fwd_region = region("model.forward", STACK_FWD)
        self.bwd_region = region("model.backward", STACK_BWD)
        self.pipe_region = region("forward_backward_pipelining",
                                STACK_PIPE_INTERLEAVED if v.chunks > 1 and pp > 1 else STACK_PIPE)
        # per stage and model chunk; fwd / bwd hold a stage's chunks one after the other
        self.fwd_chunks = [[forward_ops(cfg, s, v, c) for c in range(v.chunks)] for s in range(pp)]
        self.bwd_chunks = [[backward_ops(cfg, s, v, c) for c in range(v.chunks)] for s in range(pp)]
        self.fwd = [[o for c in self.fwd_chunks[s] for o in c] for s in range(pp)]
        self.bwd = [[o for c in self.bwd_chunks[s] for o in c] for s in range(pp)]
        self.eval_region = region("eval.forward", STACK_EVAL)
        self.ckpt = Op("host", "checkpoint.save", "io", stack=STACK_CKPT)
        act = GiB * 1.0 / cfg.mb
        self.send_f = Op("send", PP_SEND, "collective", "comm", host_ms=0.2, nbytes=act, op="send", family="pp", stream=S_PP)
        self.recv_f = Op("recv", PP_RECV, "collective", "comm", host_ms=0.2, nbytes=act, op="recv", family="pp", stream=S_PP)
        self.send_b = self.send_f
        self.recv_b = self.recv_f
        zero = dp > 1 and not v.fsdp  # FSDP moves the DP traffic into the blocks
        self.rs = (Op("coll", DP_REDUCE_SCATTER, "collective", "comm", host_ms=0.3, nbytes=4 * GiB,
                      op="reduce_scatter", family="dp", stream=S_DP) if zero else None)
        self.ag = (Op("coll", DP_ALLGATHER, "collective", "comm", host_ms=0.3, nbytes=2 * GiB,
                      op="all_gather", family="dp", stream=S_DP) if zero else None)
        self.clip_region = region("clip_grad_norm_", STACK_CLIP)
        self.l2norm = K(L2NORM, "mem", 2.0, 0.5)
        self.world_ar = (Op("coll", WORLD_ALLREDUCE, "collective", "comm", host_ms=0.1, nbytes=4,
                            op="all_reduce", family="world", stream=S_DP) if world > 1 else None)
        self.opt_region = region("optimizer.step", STACK_OPT, kind="optimizer")
        self.opt_host = 4.0 * MS
        self.clip_host = 1.5 * MS
        self.adam = K(ADAM, "mem", 22.0, 0.05)
        self.d2h = Op("memcpy", D2H, "memcpy", "copy", gpu_ms=0.02, host_ms=0.05, nbytes=4, stream=S_COMPUTE, sync=True)

    def all_ops(self) -> list[Op]:
        """Every distinct Op object of the program (send_b is send_f, and so on)."""
        ops = [self.train_step, self.log, self.gc, self.dataloader, self.h2d, self.fwd_region, self.bwd_region,
               self.pipe_region, self.send_f, self.recv_f, self.send_b, self.recv_b, self.clip_region, self.l2norm,
               self.opt_region, self.adam, self.d2h, self.eval_region, self.ckpt]
        ops += [o for o in (self.rs, self.ag, self.world_ar) if o is not None]
        for lst in self.fwd + self.bwd:
            ops += lst
        seen: set[int] = set()
        return [o for o in ops if not (id(o) in seen or seen.add(id(o)))]  # type: ignore[func-returns-value]

    def scale(self, factor: float) -> None:
        """Scale the model: every GPU and host duration and every payload by ``factor``.

        A bigger model (or batch) makes each kernel, each launch sequence and each
        gradient / activation transfer proportionally longer. Left alone: the
        4-byte scalars (grad-norm all-reduce, ``loss.item()``) whose size does not
        depend on the model, and the host ops whose duration the engine draws
        (logging, GC pauses).
        """
        for o in self.all_ops():
            o.gpu_ns *= factor
            o.host_ns *= factor
            if o.tag in ("coll", "send", "recv", "memcpy") and o.nbytes > 4:
                o.nbytes = max(1, int(round(o.nbytes * factor)))
        self.opt_host *= factor
        self.clip_host *= factor

    def records_per_rank_step(self) -> float:
        """fn records a rank writes in an ordinary step (mean over stages): sizes the tracer's sampling."""
        M, per = self.cfg.mb, []
        for s in range(self.cfg.pp):
            ops = len(self.fwd[s]) + len(self.bwd[s])
            pipe = 0 if self.cfg.pp == 1 else 2 * self.variant.chunks + 1  # sends / recvs, the pipeline region
            per.append(12 + M * ops + M * pipe)  # 12: train_step .. Memcpy DtoH, the fixed records
        return sum(per) / len(per)

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
