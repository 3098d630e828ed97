"""The `train:` section of job.yaml: the schema shared by the laptop and the server.

The orchestrator validates a job's `train:` section with `TrainConfig` before anything is sent,
and writes the resolved model (every default filled in) as JSON to `<job_dir>/train.json`; the
trainer reads it back with `TrainConfig.model_validate_json`. This module never imports torch
(the laptop imports it) and holds every default of the trainer: nothing else in
`remote_payload` invents one.

Checks that need the model or the data (does a target module exist, is a precision supported on
this device, is the data file there) happen in the trainer before training starts; this schema
checks only what can be known from the text alone.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FinetuneMode = Literal["full", "partial", "lora"]
Precision = Literal["auto", "fp32", "fp16", "bf16"]
Schedule = Literal["cosine", "linear", "constant"]
Strategy = Literal["ddp", "fsdp", "deepspeed"]
DataFormat = Literal["text", "alpaca"]
Quantize = Literal["4bit", "8bit"]
LogitPositions = Literal["labels", "all"]
Activations = Literal["fused", "model"]
MixStrategy = Literal["interleave", "oversample", "undersample"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")

class TrainSetupError(Exception):
    """A user-fixable problem the trainer finds before training starts (a missing data file, a
    LoRA target that matches nothing, ...). Its message is the whole one-line explanation."""


SampleCount = Annotated[int, Field(gt=0, description="keep this many examples")]
SampleFraction = Annotated[float, Field(gt=0.0, le=1.0, description="keep this fraction of the examples")]


class LoraSection(BaseModel):
    """peft `LoraConfig` settings; used only with `finetune: lora`."""

    model_config = _FROZEN

    r: int = Field(8, gt=0, description="LoRA rank (> 0).")
    alpha: float = Field(16, gt=0, description="LoRA scaling numerator: the update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input, in [0, 1).")
    target_modules: list[str] | None = Field(
        None,
        min_length=1,
        description=(
            "Module names (or name suffixes) to adapt, e.g. [c_attn] for GPT-2. null: peft's "
            "default for the model's architecture. The trainer fails before training starts "
            "when a name matches no module."
        ),
    )


class PartialSection(BaseModel):
    """Which modules `finetune: partial` trains; everything else is frozen."""

    model_config = _FROZEN

    trainable: list[str] = Field(
        ...,
        min_length=1,
        description=(
            "Module or parameter names to train, matched as a name or a dotted prefix "
            "(transformer.h.1 trains every parameter under it). A name that matches nothing is "
            "an error. GPT-2's lm_head shares its weight with transformer.wte: naming either "
            "trains that one shared matrix."
        ),
    )


class MixSource(BaseModel):
    """One source of `data.mix`: a jsonl file, its weight in the mixture, its format."""

    model_config = _FROZEN

    train: str = Field(..., min_length=1, description="This source's training jsonl (relative to the workspace, or absolute).")
    eval: str | None = Field(None, min_length=1, description="This source's evaluation jsonl; the eval set is every source's, whole.")
    weight: float = Field(..., gt=0.0, description="Its share of the drawn examples: weight / the sum of the weights (> 0).")
    format: DataFormat = Field("alpaca", description="text or alpaca, as data.format.")

    @property
    def name(self) -> str:
        """How metrics and `orch show` name the source: its train file."""
        return self.train


TRANSFORM_RE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class DataSection(BaseModel):
    """Training and evaluation data: jsonl files, one example per line (or a weighted `mix` of them)."""

    model_config = _FROZEN

    train: str | None = Field(
        None, min_length=1,
        description="Training jsonl, relative to the job's code snapshot or absolute. Required unless data.mix is set.")
    mix: list[MixSource] | None = Field(
        None, min_length=1,
        description=(
            "Several training files drawn by weight instead of data.train: [{train, weight, format, eval}]; "
            "how many of each is data.mix_strategy's rule (docs/trainer.md, Data mixtures)."
        ),
    )
    mix_strategy: MixStrategy = Field(
        "interleave",
        description=(
            "How many examples an epoch draws from each mix source (n = total x weight / sum of weights). "
            "interleave: total = every source's examples together (the size of their concatenation); a source "
            "with fewer examples than its share repeats, one with more is subsampled. undersample: total as large "
            "as the scarcest source allows, no example repeated (datasets' first_exhausted). oversample: total "
            "as small as shows every example of every source at least once (datasets' all_exhausted)."
        ),
    )
    neftune_alpha: float | None = Field(
        None, gt=0.0,
        description=(
            "NEFTune: uniform(-1, 1) x alpha / sqrt(sequence length x hidden size) noise added to the input "
            "embeddings in training forwards only (as transformers' neftune_noise_alpha; 5.0 is the paper's "
            "usual value); never at evaluation, never in the exported weights. null: off."
        ),
    )
    transform: str | None = Field(
        None,
        description=(
            "\"module:function\" of the workspace, called on every training example (a dict) with a seeded "
            "random.Random before tokenizing; it returns a dict, a list of dicts, or None to drop the example."
        ),
    )
    eval: str | None = Field(None, description="Optional evaluation jsonl (same format as train).")
    format: DataFormat = Field(
        "alpaca",
        description=(
            "text: objects with a `text` field, every token is a label. alpaca: objects with "
            "`instruction`, optional `input`, and `output`; prompt tokens are masked out of the loss."
        ),
    )
    max_length: int = Field(256, gt=1, description="Examples are truncated to this many tokens.")
    sample: SampleCount | SampleFraction | None = Field(
        None,
        description=(
            "Train on a deterministic subset (chosen with `seed`): an int keeps that many "
            "examples, a float in (0, 1] that fraction. null keeps everything."
        ),
    )
    packing: bool = Field(
        False,
        description=(
            "Pack several examples into each row of up to max_length tokens. Each example keeps its own "
            "positions and attends only to itself, and no label crosses an example boundary, so the loss "
            "is the unpacked one; padding mostly disappears. Evaluation is never packed."
        ),
    )
    group_by_length: bool = Field(
        False,
        description=(
            "Without packing: put examples of similar length in the same step (shuffled in chunks, "
            "sorted by length inside a chunk, batches shuffled), which cuts padding; deterministic under seed. "
            "Left out: on unless packing is on (the faster default; false gives a plain shuffle)."
        ),
    )

    @field_validator("transform")
    @classmethod
    def _module_function(cls, value: str | None) -> str | None:
        if value is not None and not re.match(TRANSFORM_RE, value):
            raise ValueError(f"write module:function, a function of a module of the workspace, e.g. "
                             f"augment.templates:vary (got {value!r})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _group_unless_packed(cls, data: Any) -> Any:
        """`group_by_length` left out: on unless `packing` is (grouping is the faster layout without
        packing, and the two exclude each other)."""
        if isinstance(data, dict) and data.get("group_by_length") is None:
            data = {**data, "group_by_length": not data.get("packing", False)}
        return data

    @model_validator(mode="after")
    def _packing_or_grouping(self) -> DataSection:
        if (self.train is None) == (self.mix is None):
            raise ValueError("set exactly one of data.train (one file) and data.mix (weighted files)")
        if self.mix is not None:
            if self.eval is not None:
                raise ValueError("data.eval goes with data.train; with data.mix give each source its own eval")
            if self.sample is not None:
                raise ValueError("data.sample goes with data.train; with data.mix the weights and data.mix_strategy "
                                 "say how many examples are drawn")
            names = [m.train for m in self.mix]
            if len(set(names)) != len(names):
                raise ValueError(f"data.mix names a train file twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        if self.packing and self.group_by_length:
            raise ValueError("data.packing and data.group_by_length exclude each other: packed rows are already "
                             "about max_length long; set one of them")
        return self


class PruneSection(BaseModel):
    """Global magnitude pruning applied to the exported model."""

    model_config = _FROZEN

    amount: float = Field(..., gt=0.0, lt=1.0, description="Fraction of the prunable weights set to zero, in (0, 1).")


class ExportSection(BaseModel):
    """What the trainer writes to `outputs/` besides the trained weights and the tokenizer."""

    model_config = _FROZEN

    merge_lora: bool = Field(
        False, description="With finetune: lora, also write the base model with the adapter merged into outputs/merged/."
    )
    prune: PruneSection | None = Field(
        None,
        description="Global magnitude pruning of the exported (merged, for LoRA) model's Linear/Conv1D weights, made permanent.",
    )


class MemorySection(BaseModel):
    """Trade compute or precision of the frozen weights for memory (what fits a 24 GB card: docs/trainer.md)."""

    model_config = _FROZEN

    gradient_checkpointing: bool = Field(
        False,
        description=(
            "Keep only each layer's input in the forward pass and recompute the rest in the backward pass: "
            "activation memory drops from every layer's to about one layer's, for roughly a third more compute. "
            "Losses and gradients are unchanged (dropout masks are replayed)."
        ),
    )
    quantize: Quantize | None = Field(
        None,
        description=(
            "QLoRA: load the frozen base weights in 4-bit NF4 (with double quantization) or 8-bit through "
            "bitsandbytes; the LoRA adapter trains in full precision. Needs finetune: lora, strategy: ddp, a CUDA "
            "GPU and the bitsandbytes package: refused before training otherwise, never silently unquantized."
        ),
    )


class DeepSpeedSection(BaseModel):
    """`strategy: deepspeed`: DeepSpeed ZeRO through Accelerate's DeepSpeed plugin (docs/trainer.md).
    Either the three ZeRO fields or `config`, a DeepSpeed JSON file (the rules of both:
    remote_payload/contract/zeroconfig.py). `deepspeed: file.json` is short for `{config: file.json}`."""

    model_config = _FROZEN

    zero_stage: Literal[1, 2, 3] = Field(
        2, description="1: optimizer state sharded; 2: and gradients; 3: and the parameters (gathered layer by layer).")
    offload_optimizer: bool = Field(
        False, description="Keep the fp32 master weights and AdamW state in CPU memory and step them there (DeepSpeedCPUAdam).")
    offload_params: bool = Field(False, description="Keep the parameters in CPU memory between uses; needs zero_stage: 3.")
    config: str | None = Field(
        None, min_length=1,
        description="A DeepSpeed JSON config of the workspace (relative to it, or absolute) instead of the fields above; "
        "its batch, accumulation, clipping and precision keys must agree with train: or be \"auto\".")

    @model_validator(mode="after")
    def _one_source(self) -> DeepSpeedSection:
        if self.config is not None and self.model_fields_set & {"zero_stage", "offload_optimizer", "offload_params"}:
            raise ValueError("deepspeed.config is the whole DeepSpeed config: set ZeRO there, or drop config and use "
                             "zero_stage / offload_optimizer / offload_params")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(f"deepspeed.offload_params needs zero_stage: 3 (it is {self.zero_stage}): only stage 3 "
                             "partitions the parameters")
        return self


class TrainConfig(BaseModel):
    """The built-in trainer's whole configuration (the `train:` section of job.yaml)."""

    model_config = _FROZEN

    model: str = Field(
        ...,
        min_length=1,
        description="A local folder (relative to the workspace), a Hugging Face hub id (honours HF_ENDPOINT), or modelscope:ORG/NAME.",
    )
    finetune: FinetuneMode = Field("lora", description="full: train everything; partial: only partial.trainable; lora: a peft adapter.")
    lora: LoraSection | None = Field(None, description="LoRA settings; filled with defaults when finetune is lora, an error otherwise.")
    partial: PartialSection | None = Field(None, description="Required when finetune is partial, an error otherwise.")
    data: DataSection = Field(..., description="Training (and optional eval) data.")
    precision: Precision = Field(
        "auto",
        description="auto: bf16 where the device has fast bf16 (GPUs with native bf16, CPUs with AMX), fp32 otherwise. "
        "fp16 runs with a GradScaler and not with strategy: fsdp; bf16 is refused on GPUs without it (rules: precision.py).",
    )
    batch_size: int = Field(8, gt=0, description="Micro-batch per process.")
    grad_accum: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    epochs: int = Field(1, gt=0, description="Passes over the training data when max_steps is null.")
    max_steps: int | None = Field(
        None, gt=0, description="Train exactly this many optimizer steps, going over the data as often as needed (overrides epochs)."
    )
    lr: float = Field(2.0e-4, gt=0.0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    warmup_steps: int = Field(10, ge=0, description="Linear warm-up from 0 to lr over this many optimizer steps.")
    schedule: Schedule = Field("cosine", description="Learning-rate decay after warm-up: cosine or linear towards 0 (reached one step after the last), or constant.")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm to this; null: no clipping.")
    seed: int = Field(42, ge=0, description="Seeds model init of new modules, data order, sampling and dropout.")
    log_every: int = Field(10, gt=0, description="Write a metrics.jsonl line and a log line every this many steps.")
    eval_every: int = Field(100, gt=0, description="Evaluate on data.eval every this many steps (and at the end).")
    save_every: int = Field(100, gt=0, description="Write a checkpoint every this many steps (and at the end, and on SIGTERM).")
    keep_checkpoints: int = Field(2, gt=0, description="Keep this many newest complete checkpoints; older ones are deleted after a successful save.")
    strategy: Strategy = Field(
        "ddp", description="ddp: data parallel. fsdp: torch FSDP2, params/grads/optimizer state sharded; not with fp16. "
        "deepspeed: DeepSpeed ZeRO 1/2/3 with optional CPU offload (train.deepspeed).")
    deepspeed: DeepSpeedSection | None = Field(
        None, description="ZeRO settings for strategy: deepspeed (defaults: stage 2, no offload), or a DeepSpeed JSON file.")
    logits: LogitPositions = Field(
        "labels",
        description=(
            "labels: the output head and the loss run only at the positions that carry a label (the same loss and "
            "gradients as all, with less compute and memory where prompts are masked, batches padded or the "
            "vocabulary large); the trainer checks at start that the model's head fits this and otherwise falls back "
            "to all, saying so in the log. all: logits at every position, the model's own forward."
        ),
    )
    activations: Activations = Field(
        "fused",
        description=(
            "fused: transformers' Python GELU modules of the tanh form (gelu_new, gelu_fast: GPT-2, GPT-J, Phi, ...) run "
            "as torch's single fused kernel of the same function (rounding differs, ~1e-7 relative); nothing else "
            "changes and nothing is saved differently. model: the model's own modules."
        ),
    )
    memory: MemorySection = Field(default_factory=MemorySection, description="Gradient checkpointing and QLoRA base weights.")
    tensorboard: bool = Field(
        False,
        description="Also write TensorBoard event files (the metrics.jsonl scalars) to runs/ in the job folder (rank 0); "
        "needs the tensorboard package on the server, said at start when it is missing.",
    )
    export: ExportSection = Field(default_factory=ExportSection, description="Extra outputs: merged LoRA model, pruning.")

    @model_validator(mode="before")
    @classmethod
    def _fill_lora_defaults(cls, data: Any) -> Any:
        """`finetune: lora` without a `lora:` section uses the default LoRA settings; `strategy:
        deepspeed` without `deepspeed:` the default ZeRO settings, and `deepspeed: file.json` is the file."""
        if isinstance(data, dict):
            if isinstance(data.get("deepspeed"), str):
                data = {**data, "deepspeed": {"config": data["deepspeed"]}}
            if data.get("strategy") == "deepspeed" and data.get("deepspeed") is None:
                data = {**data, "deepspeed": {}}
            finetune = data.get("finetune", cls.model_fields["finetune"].default)
            if finetune == "lora" and data.get("lora") is None:
                data = {**data, "lora": {}}
        return data

    @model_validator(mode="after")
    def _sections_match_mode(self) -> TrainConfig:
        if self.finetune != "lora" and self.lora is not None:
            raise ValueError(f"the lora section is only used with finetune: lora (finetune is {self.finetune})")
        if self.finetune == "partial" and self.partial is None:
            raise ValueError("finetune: partial needs partial.trainable, the modules to train")
        if self.finetune != "partial" and self.partial is not None:
            raise ValueError(f"the partial section is only used with finetune: partial (finetune is {self.finetune})")
        if self.export.merge_lora and self.finetune != "lora":
            raise ValueError(f"export.merge_lora needs finetune: lora (finetune is {self.finetune})")
        if self.export.prune is not None and self.finetune == "lora" and not self.export.merge_lora:
            raise ValueError("export.prune with finetune: lora prunes the merged model: set export.merge_lora: true")
        if self.memory.quantize and self.finetune != "lora":
            raise ValueError(f"memory.quantize freezes the base weights in {self.memory.quantize}: it needs finetune: lora "
                             f"(finetune is {self.finetune})")
        if self.deepspeed is not None and self.strategy != "deepspeed":
            raise ValueError(f"the deepspeed section is only used with strategy: deepspeed (strategy is {self.strategy})")
        if self.memory.quantize and self.strategy == "deepspeed":
            raise ValueError("memory.quantize cannot run under strategy: deepspeed: ZeRO-3 partitions parameters that "
                             "bitsandbytes holds packed, and every stage casts the model to its 16-bit precision; use strategy: ddp")
        if self.memory.quantize and self.strategy == "fsdp":
            raise ValueError("memory.quantize does not shard: bitsandbytes weights cannot be split by strategy: fsdp; "
                             "use strategy: ddp")
        return self
