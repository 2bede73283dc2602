"""Every rule that the spec alone decides about a job's layout, in one place: the model's shape, the parallel
degrees, the batch, the data format and the world size. Pure and torch-free over plain data (`JobLayout`), so the
schema's validation (`spec/job.py`), the planner's search, the trainer's preflight and the CRD's CEL rules (checked
against it by tests/spec/test_crd_rules.py) all ask the same question and get the same answer.

Each `Problem` names the field (its path under `spec`, camelCase as in YAML) and the fix. `rule` is a short stable
id, so the CRD's CEL rules can say which rules they mirror.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

BYTE_VOCAB = 256  # a .txt data source is read as bytes


@dataclass(frozen=True)
class Problem:
    rule: str  # a stable id, e.g. "mesh", "tp-heads"
    field: str  # the path under spec, e.g. "trainer.parallelism.tp"
    detail: str  # what is wrong, with the numbers
    fix: str  # what to change

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}; {self.fix}"


@dataclass(frozen=True)
class JobLayout:
    """What the rules read: the model's resolved sizes, the parallel degrees, the batch and the data source."""

    layers: int
    dim: int
    heads: int
    vocab: int
    seq_len: int
    experts: int = 0  # 0: a dense model
    top_k: int = 0
    moe_every: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    fsdp: bool = True
    schedule: str = "1f1b"
    stages_per_rank: int = 1
    microbatches: int | None = None
    global_batch: int = 32
    micro_batch: int = 4
    data_source: str = "synthetic"
    # The decoder's finer shape (spec_model.ModelShape): 0 means derived (kv_heads = heads, ffn = 4 x dim,
    # max_positions = seq_len). `pretrained`: the sizes are in a config.json the spec does not hold, so the rules
    # on the model's sizes are left to the trainer's preflight, which reads it.
    architecture: str = "gpt"
    kv_heads: int = 0
    ffn: int = 0
    max_positions: int = 0
    pretrained: bool = False
    tokenizer_vocab: int = 0  # ids the job's tokenizer may produce; 0: none, or its file is not readable here
    chunked_loss: bool = False  # training.chunkedLoss: the head and loss over chunks of tokens


def model_problems(job: JobLayout) -> list[Problem]:
    """The model's own shape and the pipeline schedule's form: checked even for a user command."""
    out = [] if job.pretrained else _shape_problems(job)
    if job.experts and job.top_k > job.experts:
        out.append(Problem("moe-topk", "trainer.model.moe.topK", f"topK ({job.top_k}) is more than experts "
                           f"({job.experts})", "route to at most every expert"))
    if job.experts and job.moe_every > job.layers:
        out.append(Problem("moe-every", "trainer.model.moe.every", f"{job.moe_every} is more than layers "
                           f"({job.layers}), so no block would get experts", "lower every"))
    if job.stages_per_rank > 1 and job.schedule != "interleaved-1f1b":
        out.append(Problem("pp-schedule", "trainer.parallelism.stagesPerRank", f"{job.stages_per_rank} stages per "
                           f"rank need schedule: interleaved-1f1b (not {job.schedule})",
                           "set stagesPerRank: 1 or schedule: interleaved-1f1b"))
    if job.schedule == "interleaved-1f1b" and job.stages_per_rank < 2:
        out.append(Problem("pp-schedule", "trainer.parallelism.stagesPerRank", "interleaved-1f1b needs "
                           "stagesPerRank >= 2", "set stagesPerRank: 2 or use schedule: 1f1b"))
    return out


def _shape_problems(job: JobLayout) -> list[Problem]:
    kv_heads, max_positions = job.kv_heads or job.heads, job.max_positions or job.seq_len
    if job.dim % job.heads:
        return [Problem("model-heads", "trainer.model.heads", f"dim ({job.dim}) is not divisible by heads "
                        f"({job.heads})", "pick heads that divide dim")]
    out = []
    if job.heads % kv_heads:
        out.append(Problem("model-kv-heads", "trainer.model.kvHeads", f"kvHeads ({kv_heads}) does not divide heads "
                           f"({job.heads})", "pick a kvHeads that divides heads"))
    if job.architecture == "llama" and (job.dim // job.heads) % 2:
        out.append(Problem("model-rope", "trainer.model.heads", f"dim / heads ({job.dim // job.heads}) is odd; "
                           "rotary embeddings need an even head width", "pick heads so that dim / heads is even"))
    if job.architecture == "gpt" and kv_heads != job.heads:
        out.append(Problem("model-gqa", "trainer.model.kvHeads", "grouped-query attention needs a llama "
                           "architecture", "remove kvHeads or use a llama preset"))
    if job.experts and job.architecture != "gpt":
        out.append(Problem("moe-arch", "trainer.model.moe", "mixture of experts is available for the gpt "
                           "architecture only", "remove moe or use a gpt preset"))
    if max_positions < job.seq_len:
        out.append(Problem("model-positions", "trainer.model.seqLen", f"seqLen ({job.seq_len}) is more than the "
                           f"model's {max_positions} positions", "lower seqLen"))
    return out


def static_problems(job: JobLayout) -> list[Problem]:
    """The trainer's layout rules that hold at any world size: batch, tensor, expert and pipeline parallel."""
    out = []
    if job.global_batch % job.micro_batch:
        out.append(Problem("batch-micro", "trainer.training.globalBatch", f"{job.global_batch} is not divisible by "
                           f"microBatch ({job.micro_batch})", "make globalBatch a multiple of microBatch"))
    out += _tp_problems(job) + _ep_problems(job)
    stages = job.pp * job.stages_per_rank
    if job.layers % stages and not job.pretrained:  # a pretrained model's layers: the trainer's preflight
        out.append(Problem("pp-layers", "trainer.parallelism.pp", f"{job.layers} layers do not split evenly into "
                           f"pp x stagesPerRank = {stages} stages",
                           "choose pp and stagesPerRank whose product divides trainer.model.layers"))
    if job.chunked_loss and job.pp > 1:  # the pipeline schedule's loss takes the last stage's whole logits
        out.append(Problem("pp-chunked-loss", "trainer.training.chunkedLoss", f"the chunked loss does not run under "
                           f"pipeline parallel (pp = {job.pp}): the schedule's loss takes the last stage's logits",
                           "set chunkedLoss: false or pp: 1"))
    return out


def data_problems(job: JobLayout) -> list[Problem]:
    """What the data source's format says about the model, whatever the layout (its contents are checked where it
    is read)."""
    if job.data_source.endswith(".txt") and job.vocab < BYTE_VOCAB:
        return [Problem("data-vocab", "trainer.model.vocab", f"text data ({job.data_source}) uses byte tokens but "
                        f"vocab is {job.vocab}", f"set trainer.model.vocab to at least {BYTE_VOCAB}")]
    problem = None if job.pretrained else tokenizer_vocab_problem(job.vocab, job.tokenizer_vocab)
    return [problem] if problem else []


def tokenizer_vocab_problem(model_vocab: int, tokenizer_vocab: int) -> Problem | None:
    """The model's embedding must cover every id the tokenizer produces (0: no tokenizer, nothing to check). The
    trainer's preflight asks it again with a pretrained model's config.json vocab."""
    if tokenizer_vocab <= model_vocab:
        return None
    return Problem("data-tokenizer-vocab", "trainer.model.vocab", f"the tokenizer (trainer.data.tokenizer) has "
                   f"{tokenizer_vocab} tokens but the model's vocab is {model_vocab}",
                   f"set trainer.model.vocab to at least {tokenizer_vocab}")


def _tp_problems(job: JobLayout) -> list[Problem]:
    # Sequence parallel shards the sequence and the heads over tp; the MLP width 4 x dim then divides too
    # (heads divide dim). The embeddings and the tied head stay whole, so vocab is free.
    if job.tp == 1:
        return []
    out = []
    if not job.fsdp:  # DDP takes no DTensor parameters; torch's bridge would lose them from the state dict
        out.append(Problem("tp-fsdp", "trainer.parallelism.fsdp", f"tp = {job.tp} needs fsdp: true (DDP cannot "
                           "replicate tensor-parallel parameters)", "set fsdp: true or tp: 1"))
    return out + ([] if job.pretrained else tp_size_problems(job.heads, job.kv_heads or job.heads, job.seq_len,
                                                              job.ffn or 4 * job.dim, job.tp))


def tp_size_problems(heads: int, kv_heads: int, seq_len: int, ffn: int, tp: int) -> list[Problem]:
    """The sizes tensor parallel splits: the heads and key/value heads (attention), the sequence (sequence
    parallel) and the MLP width. The trainer asks it again with a pretrained model's config.json sizes."""
    sizes: tuple[tuple[str, str, int, str], ...] = (
        ("tp-heads", "heads", heads, ""), ("tp-kv-heads", "kvHeads", kv_heads, ""),
        ("tp-seq", "seqLen", seq_len, " (sequence parallel)"), ("tp-ffn", "ffn", ffn, " (the MLP width)"))
    sizes = tuple(size for size in sizes if size[0] != "tp-kv-heads" or kv_heads != heads)  # said once, as heads
    return [Problem(rule, "trainer.parallelism.tp", f"{name} ({value}) is not divisible by tp ({tp}){why}",
                    f"choose a tp that divides trainer.model.{name}") for rule, name, value, why in sizes if value % tp]


def _ep_problems(job: JobLayout) -> list[Problem]:
    if not job.experts:
        return [Problem("ep-dense", "trainer.parallelism.ep", f"ep = {job.ep} splits experts, but the model has "
                        "none", "set model.moe (e.g. {experts: 8, topK: 2}) or ep: 1")] if job.ep > 1 else []
    out = []
    if job.experts % job.ep:
        out.append(Problem("ep-experts", "trainer.parallelism.ep", f"ep = {job.ep} does not divide "
                           f"model.moe.experts ({job.experts})", "pick an ep that divides the number of experts"))
    if job.ep > 1 and not job.fsdp:
        out.append(Problem("ep-fsdp", "trainer.parallelism.fsdp", f"ep = {job.ep} needs fsdp: true (DDP cannot "
                           "replicate the expert-parallel DTensor parameters)", "set fsdp: true or ep: 1"))
    if job.pp > 1:
        out.append(Problem("moe-pp", "trainer.parallelism.pp", f"an MoE model runs with pp: 1 (got {job.pp}); its "
                           "load-balancing loss is not carried between pipeline stages",
                           "use dp, tp and ep, or a dense model"))
    return out


def world_problems(job: JobLayout, world: int) -> list[Problem]:
    """The rules that depend on the world size (ranks): the mesh, expert and data parallel, the pipeline's micro
    batches. Once one fails, the later ones (which need dp) are not asked."""
    model_parallel = job.tp * job.pp
    if world % model_parallel:
        return [Problem("mesh", "trainer.parallelism.tp", f"tp x pp = {job.tp} x {job.pp} does not divide the "
                        f"world size {world}", "choose tp and pp whose product divides every world size in "
                        "replicas [min, max] x procsPerReplica")]
    dp = world // model_parallel
    if dp % job.ep:
        return [Problem("ep-dp", "trainer.parallelism.ep", f"ep = {job.ep} does not divide dp = {dp} (world {world} "
                        f"/ tp x pp = {model_parallel})", "expert parallelism borrows from the data-parallel ranks, "
                        "so choose an ep that divides dp at every world size")]
    if job.global_batch % (job.micro_batch * dp):
        return [Problem("batch-dp", "trainer.training.globalBatch", f"{job.global_batch} is not divisible by "
                        f"microBatch x dp = {job.micro_batch} x {dp}",
                        f"make globalBatch a multiple of {job.micro_batch * dp}")]
    problem = pipeline_problem(job, job.global_batch // (job.micro_batch * dp))
    return [problem] if problem else []


def pipeline_problem(job: JobLayout, local_microbatches: int) -> Problem | None:
    """The pipeline schedule's rule on the micro batches each dp rank runs per step (globalBatch / (dp x
    microBatch)); None without a pipeline or when it holds."""
    if job.pp == 1:
        return None
    per_run = job.microbatches or local_microbatches
    if local_microbatches % per_run:
        return Problem("pp-microbatches", "trainer.parallelism.microbatches", f"{per_run} does not divide the "
                       f"{local_microbatches} micro batches per dp rank and step (globalBatch / (dp x microBatch))",
                       "pick a divisor or leave it unset")
    if job.schedule == "1f1b" and per_run < job.pp:
        return Problem("pp-microbatches", "trainer.parallelism.microbatches", f"1f1b needs at least pp = {job.pp} "
                       f"micro batches per run, got {per_run}", "raise globalBatch or microbatches, or lower "
                       "microBatch")
    if job.schedule == "interleaved-1f1b" and per_run % max(1, per_run // job.pp):
        return Problem("pp-microbatches", "trainer.parallelism.microbatches", f"interleaved-1f1b runs {per_run} "
                       f"micro batches in rounds of pp = {job.pp}", "make the count a multiple of pp or smaller "
                       "than it")
    return None


def layout_problems(job: JobLayout, world: int) -> list[Problem]:
    """Everything that keeps this layout from running on `world` ranks (empty: it runs)."""
    return model_problems(job) + data_problems(job) + static_problems(job) + world_problems(job, world)


def elastic_problems(job: JobLayout, replica_counts: Iterable[int], procs_per_replica: int) -> list[Problem]:
    """The world-size rules at every replica count an elastic job may run at (world = replicas x procsPerReplica),
    the first failure of each rule, naming the replica count."""
    seen: dict[str, Problem] = {}
    for replicas in replica_counts:
        for p in world_problems(job, replicas * procs_per_replica):
            seen.setdefault(p.rule, Problem(p.rule, p.field, f"{p.detail} at {replicas} replicas", p.fix))
    return list(seen.values())


def job_problems(job: JobLayout, replica_counts: Iterable[int], procs_per_replica: int) -> list[Problem]:
    """The layout rules for a job the trainer runs, at every replica count in its range (the model's shape and the
    data are `model_problems` and `data_problems`)."""
    return static_problems(job) + elastic_problems(job, replica_counts, procs_per_replica)


def dp_wrapper(fsdp: bool, dp: int, tp: int) -> Literal["fsdp", "ddp"] | None:
    """What wraps the model across data parallel: FSDP2 (`fsdp: true`) or DDP, and nothing over a dp group of one
    rank without tensor parallel, as TorchTitan at dp 1: there is nothing to shard or reduce there, and either
    wrapper only costs (FSDP2 over one rank: 20-35% of a CPU step in copies in and out of its buffers). The values
    are the same (fp32: bitwise); bf16 then autocasts instead of FSDP2's mixed-precision policy. Under tensor
    parallel FSDP2 stays at dp 1: it makes every parameter a DTensor, as the fused optimizer needs (it refuses a mix
    of the tp-sharded DTensors and plain tensors)."""
    if dp == 1 and tp == 1:
        return None
    return "fsdp" if fsdp else "ddp"
