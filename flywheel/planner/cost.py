"""The planner's cost model: step time and peak memory per rank of one layout, from the model's shape, the batch
and a device entry. Pure arithmetic (no torch), so it sizes 1.3B-parameter models on a laptop.

Memory follows the usual accounting: fp32 parameters, gradients and two AdamW moments (16 bytes per parameter),
divided by dp where FSDP shards them (ZeRO-3 all four; ZeRO-2 all but the parameters), DDP's gradient buckets (4
more bytes per parameter), activations per micro batch (about 17 values per token and width per block with
memory-efficient attention and a 4 x dim GELU MLP, more with a SwiGLU or wider MLP; divided by tp with sequence
parallel; the block inputs only under activation
checkpointing), the logits, micro batches in flight under 1F1B pipelining, and a fixed runtime share. Time is the
compute at the device's achievable FLOP rate, stretched by the pipeline bubble, plus the communication the layout
adds (data-parallel gradient traffic partly hidden behind backward; tensor-parallel and pipeline traffic exposed).
The shape (`flywheel.layout.shape.ModelShape`, gpt or llama) is the trainer's own, so are its parameter counts.

Mixture of experts (the trainer's moe.py and expert_parallel.py): expert weights are split over ep and FSDP-sharded
over the remaining dp / ep ranks, so at rest they cost every rank 1/dp of them like the rest; ZeRO-2 and the
gathered block hold E/ep experts. A token computes k of the E experts (the FLOP count), the MoE layer runs
replicated on every tp rank (its compute and activations are not divided by tp), each routed token keeps about
12 values per width (expert hidden and GELU input, its copies through dispatch and combine), and each MoE layer
adds four exposed all-to-alls per micro batch (dispatch and combine, forward and backward; two more under
recompute) moving k x tokens x width x (ep - 1) / ep per rank, plus the experts' gradient reduction over edp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flywheel.layout.rules import dp_wrapper
from flywheel.layout.shape import ModelShape
from flywheel.planner.devices import Device, Link

FP32 = 4
ADAMW_STATE = 2 * FP32  # exp_avg and exp_avg_sq per parameter
ATTENTION_VALUES_PER_TOKEN_WIDTH = 9  # per block: qkv, attention output, norms, residual
EXPERT_VALUES_PER_ROUTED_TOKEN_WIDTH = 12  # per routed token: 4x hidden, GELU input, routed copies and outputs
RECOMPUTE_FLOPS = 4 / 3  # one more forward (1/3 of forward + backward)


@dataclass(frozen=True)
class Batch:
    global_batch: int
    precision: str  # "fp32" or "bf16"


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    micro_batch: int
    fsdp: bool
    zero: int  # 3 or 2 with fsdp; ignored by DDP
    activation_checkpointing: bool
    ep: int = 1  # expert parallel, a divisor of dp (MoE models)

    def microbatches(self, global_batch: int) -> int:
        """Micro batches per step on each data-parallel rank (gradient accumulation, or the pipeline's)."""
        return global_batch // (self.dp * self.micro_batch)

    def describe(self) -> str:
        sharding = f"fsdp/zero{self.zero}" if self.fsdp else "ddp"
        return (f"dp{self.dp} tp{self.tp} pp{self.pp}{f' ep{self.ep}' if self.ep > 1 else ''} mb{self.micro_batch} "
                f"{sharding}{' +ac' if self.activation_checkpointing else ''}")


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    microbatches: int
    step_seconds: float
    compute_seconds: float
    communication_seconds: float
    bubble_fraction: float
    memory_bytes: float
    memory_breakdown: dict[str, float]
    fits: bool


def estimate(shape: ModelShape, batch: Batch, layout: Layout, device: Device, ranks_per_worker: int) -> Estimate:
    m = layout.microbatches(batch.global_batch)
    memory = memory_breakdown(shape, batch, layout, device)
    compute = _compute_seconds(shape, batch, layout, device)
    bubble = (layout.pp - 1) / (m + layout.pp - 1) if layout.pp > 1 else 0.0
    comm = _communication_seconds(shape, batch, layout, device, ranks_per_worker, compute)
    total_memory = sum(memory.values())
    return Estimate(layout=layout, microbatches=m, step_seconds=compute / (1 - bubble) + comm,
                    compute_seconds=compute, communication_seconds=comm, bubble_fraction=bubble,
                    memory_bytes=total_memory, memory_breakdown=memory, fits=total_memory <= device.memory_bytes)


def stage_params(shape: ModelShape, layout: Layout) -> float:
    """Parameters other than experts one rank holds before data-parallel sharding: its pipeline stage's blocks split
    over tp (an MoE block's router stays whole); the embeddings (first stage) and the tied head (last stage) stay
    whole. The worst stage counts."""
    blocks = math.ceil(shape.layers / layout.pp) * shape.block_params / layout.tp
    if shape.moe_layers:  # pp is 1
        blocks = (((shape.layers - shape.moe_layers) * shape.block_params + shape.moe_layers * shape.moe_shared_params)
                  / layout.tp + shape.moe_layers * shape.dim * shape.experts)
    # Pipelined: the token (and position) embeddings on the first stage, the head (a copy when tied) on the last.
    first_stage = shape.vocab * shape.dim + shape.position_params
    ends = shape.embedding_params if layout.pp == 1 else max(first_stage, shape.vocab * shape.dim)
    return blocks + ends + shape.norm_params


def rank_expert_params(shape: ModelShape, layout: Layout) -> float:
    """Expert parameters one rank holds before FSDP shards them over edp = dp / ep: E / ep experts per layer."""
    return shape.all_expert_params / layout.ep


def mlp_values_per_token_width(shape: ModelShape) -> float:
    """Activation values a dense MLP keeps per token and width: GELU's hidden and its input (2 x ffn / dim, 8 at the
    usual 4 x dim); SwiGLU's gate, up, activated gate and product (4 x ffn / dim)."""
    per_hidden = 2 if shape.architecture == "gpt" else 4
    return per_hidden * shape.ffn / shape.dim


def memory_breakdown(shape: ModelShape, batch: Batch, layout: Layout, device: Device) -> dict[str, float]:
    # Experts are sharded over edp = dp / ep, the rest over dp: per rank, n / dp + e / edp, sharded.
    n, e = stage_params(shape, layout), rank_expert_params(shape, layout)
    dp, edp = layout.dp, layout.dp // layout.ep
    if not layout.fsdp:
        n += e  # DDP has no expert parallel
        states = {"parameters": n * FP32, "gradients": 2 * n * FP32, "optimizer": n * ADAMW_STATE}  # + DDP buckets
    elif layout.zero == 2:
        states = {"parameters": (n + e) * FP32, "gradients": n * FP32 / dp + e * FP32 / edp,
                  "optimizer": n * ADAMW_STATE / dp + e * ADAMW_STATE / edp}
    else:
        # Sharded at rest; two blocks' parameters are gathered at a time (the one computing and the prefetch).
        block = shape.block_params / layout.tp
        if shape.moe_layers:
            block = max(block, shape.moe_shared_params / layout.tp + shape.dim * shape.experts
                        + shape.experts / layout.ep * shape.expert_params)
        gathered = 2 * block * FP32
        states = {"parameters": n * FP32 / dp + e * FP32 / edp + gathered,
                  "gradients": n * FP32 / dp + e * FP32 / edp + gathered,
                  "optimizer": n * ADAMW_STATE / dp + e * ADAMW_STATE / edp}
    act_bytes = FP32 if batch.precision == "fp32" else 2.5  # bf16 autocast keeps norms and the residual in fp32
    tokens = layout.micro_batch * shape.seq_len
    layers_here = math.ceil(shape.layers / layout.pp)
    values = ATTENTION_VALUES_PER_TOKEN_WIDTH + mlp_values_per_token_width(shape)
    per_block = values * tokens * shape.dim * act_bytes / layout.tp
    # An MoE block: attention and norms as a dense block's; the experts' values per routed token, on every tp rank.
    moe_block = (ATTENTION_VALUES_PER_TOKEN_WIDTH / layout.tp
                 + EXPERT_VALUES_PER_ROUTED_TOKEN_WIDTH * shape.top_k) * tokens * shape.dim * act_bytes
    if layout.activation_checkpointing:
        # Each block's input is kept; one block's activations live at a time while it is recomputed.
        activations = layers_here * tokens * shape.dim * FP32 + (max(per_block, moe_block) if shape.moe_layers
                                                                 else per_block)
    else:
        activations = (layers_here - shape.moe_layers) * per_block + shape.moe_layers * moe_block
    in_flight = min(layout.pp, layout.microbatches(batch.global_batch)) if layout.pp > 1 else 1  # 1F1B, stage 0
    # Log-softmax output and its gradient, fp32, on the last stage (the logits themselves are freed).
    logits = 2 * tokens * shape.vocab * FP32
    # The foreach AdamW step allocates one parameter-sized temporary (the denominator) for the rank's shard.
    step_temporary = states["optimizer"] / 2
    return {**states, "optimizer step": step_temporary, "activations": activations * in_flight, "logits": logits,
            "runtime": device.runtime_bytes}


def _compute_seconds(shape: ModelShape, batch: Batch, layout: Layout, device: Device) -> float:
    tokens_per_step = batch.global_batch * shape.seq_len
    # The MoE layers' compute is repeated on every tp rank.
    moe = shape.moe_flops_per_token()
    flops = ((shape.flops_per_token() - moe) * batch.global_batch * shape.seq_len / (layout.dp * layout.tp * layout.pp)
             + moe * tokens_per_step / (layout.dp * layout.pp))
    if layout.activation_checkpointing:
        flops *= RECOMPUTE_FLOPS
    # Small micro batches leave the device under-used (launch and framework overhead per op dominate); narrower
    # matmuls under tensor parallel run a little less efficiently.
    tokens = layout.micro_batch * shape.seq_len
    efficiency = (device.efficiency * tokens / (tokens + device.half_efficiency_tokens)
                  * (1 - 0.04 * math.log2(layout.tp)))
    seconds = flops / (device.flops(batch.precision) * efficiency)
    sharded = dp_wrapper(layout.fsdp, layout.dp, layout.tp) == "fsdp"  # no wrapper over one rank: no overhead
    return seconds * (1 + device.sharding_overhead) if sharded else seconds


def _link(spans_workers: bool, device: Device) -> Link:
    return device.inter_node if spans_workers else device.intra_node


def _collective_seconds(volume_bytes: float, group: int, link: Link, count: int) -> float:
    """Ring collectives: an all-reduce moves 2(g-1)/g of the buffer per rank, all-gather/reduce-scatter (g-1)/g;
    `volume_bytes` already carries that factor's numerator multiple."""
    if group <= 1:
        return 0.0
    return volume_bytes * (group - 1) / group / link.bandwidth_bytes_per_second + count * link.latency_seconds


def _communication_seconds(shape: ModelShape, batch: Batch, layout: Layout, device: Device, ranks_per_worker: int,
                           compute: float) -> float:
    m = layout.microbatches(batch.global_batch)
    # Rank order is tp innermost, then pp, dp outermost (parallelize.py), so a group spans workers when its
    # members, spaced by the inner degrees, do not fit in one worker.
    tp_link = _link(layout.tp > ranks_per_worker, device)
    pp_link = _link(layout.tp * layout.pp > ranks_per_worker, device)
    dp_link = _link(layout.dp * layout.tp * layout.pp > ranks_per_worker, device)
    grad_bytes = stage_params(shape, layout) * FP32
    expert_bytes = rank_expert_params(shape, layout) * FP32
    if not layout.fsdp:
        grad_bytes += expert_bytes  # DDP: no expert parallel, experts reduced with the rest
        expert_bytes = 0.0
        dp_volume, dp_count = 2 * grad_bytes, 2  # all-reduce, in ~2 buckets at this size
        expert_factor, expert_count = 0, 0
    elif layout.zero == 2:
        dp_volume, dp_count = 2 * grad_bytes, 2 * math.ceil(shape.layers / layout.pp)  # all-gather + reduce-scatter
        expert_factor, expert_count = 2, 2 * shape.moe_layers
    else:
        dp_volume, dp_count = 3 * grad_bytes, 3 * math.ceil(shape.layers / layout.pp)  # + all-gather in backward
        expert_factor, expert_count = 3, 3 * shape.moe_layers
    dp_seconds = _collective_seconds(dp_volume, layout.dp, dp_link, dp_count)
    if expert_count:  # the experts' own FSDP group: edp ranks spaced ep x tp x pp apart
        dp_seconds += _collective_seconds(expert_factor * expert_bytes, layout.dp // layout.ep, dp_link, expert_count)
    # Hidden behind backward (about 2/3 of compute) as far as the device overlaps it.
    dp_exposed = max(dp_seconds - device.comm_overlap * compute * 2 / 3, dp_seconds * (1 - device.comm_overlap))
    act_bytes = FP32 if batch.precision == "fp32" else 2
    activation = layout.micro_batch * shape.seq_len * shape.dim * act_bytes
    layers_here = math.ceil(shape.layers / layout.pp)
    # Per block and micro batch: 2 all-reduces forward and 2 backward (or the same volume as all-gather +
    # reduce-scatter with sequence parallel).
    # An MoE block replaces the MLP's 2 + 2 by an all-gather of its input (forward) and of its output's gradient.
    dense_here = layers_here - shape.moe_layers
    tp_seconds = _collective_seconds(4 * 2 * activation * dense_here * m + 6 * activation * shape.moe_layers * m,
                                     layout.tp, tp_link, (4 * dense_here + 3 * shape.moe_layers) * m)
    # Per micro batch: activations forward and their gradients backward across each stage boundary.
    pp_seconds = (2 * m * (activation / pp_link.bandwidth_bytes_per_second + pp_link.latency_seconds)
                  if layout.pp > 1 else 0.0)
    return dp_exposed + tp_seconds + pp_seconds + _all_to_all_seconds(shape, batch, layout, device, ranks_per_worker)


def _all_to_all_seconds(shape: ModelShape, batch: Batch, layout: Layout, device: Device,
                        ranks_per_worker: int) -> float:
    """Expert-parallel dispatch and combine, exposed: an ep group is ep consecutive dp ranks, tp x pp apart. Per
    MoE layer and micro batch: forward dispatch + combine, the same backward (and the forward again under
    recompute), each moving k x tokens x width per rank, of which (ep - 1) / ep leaves the rank; one count
    exchange (latency only) per forward."""
    if layout.ep == 1 or not shape.moe_layers:
        return 0.0
    ep_link = _link(layout.ep * layout.tp * layout.pp > ranks_per_worker, device)
    act_bytes = FP32 if batch.precision == "fp32" else 2
    routed = shape.top_k * layout.micro_batch * shape.seq_len * shape.dim * act_bytes
    forwards = 2 if layout.activation_checkpointing else 1
    per_layer = (2 * forwards + 2) * routed
    collectives = 3 * forwards + 2
    m = layout.microbatches(batch.global_batch)
    return _collective_seconds(per_layer * shape.moe_layers * m, layout.ep, ep_link,
                               collectives * shape.moe_layers * m)
