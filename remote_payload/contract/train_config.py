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

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FinetuneMode = Literal["full", "partial", "lora"]
Precision = Literal["auto", "fp32", "fp16", "bf16"]
Schedule = Literal["cosine", "linear", "constant"]
Strategy = Literal["ddp", "fsdp"]
DataFormat = Literal["text", "alpaca"]
Quantize = Literal["4bit", "8bit"]
LogitPositions = Literal["labels", "all"]
Activations = Literal["fused", "model"]

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


class DataSection(BaseModel):
    """Training and evaluation data: jsonl files, one example per line."""

    model_config = _FROZEN

    train: str = Field(..., min_length=1, description="Training jsonl, relative to the job's code snapshot or absolute.")
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
    strategy: Strategy = Field("ddp", description="ddp: data parallel. fsdp: torch FSDP2, params/grads/optimizer state sharded; not with fp16.")
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
    export: ExportSection = Field(default_factory=ExportSection, description="Extra outputs: merged LoRA model, pruning.")

    @model_validator(mode="before")
    @classmethod
    def _fill_lora_defaults(cls, data: Any) -> Any:
        """`finetune: lora` without a `lora:` section uses the default LoRA settings."""
        if isinstance(data, dict):
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
        if self.memory.quantize and self.strategy == "fsdp":
            raise ValueError("memory.quantize does not shard: bitsandbytes weights cannot be split by strategy: fsdp; "
                             "use strategy: ddp")
        return self
