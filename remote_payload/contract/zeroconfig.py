"""`train.strategy: deepspeed`: the DeepSpeed config the built-in trainer runs with, and what is
wrong with a user's DeepSpeed JSON file — the one home of these rules, for the laptop and the trainer.

    config = build(section, job, text)   # the whole DeepSpeed config dict (raises ZeroConfigError)
    problems(section, job, text)         # every refusal, each with the file's line where it has one

`job` (`JobValues`) is what the `train:` section already says: micro-batch, accumulation, clipping
and precision. DeepSpeed reads the same settings from its own keys; the trainer fills them from the
job (a value of "auto" in a user's file is filled the same way), and a file that says something
else is refused rather than run with one of the two silently winning:

- `train_micro_batch_size_per_gpu` = batch_size, `gradient_accumulation_steps` = grad_accum,
  `train_batch_size` = their product x processes (only the world size decides that one: the
  trainer checks it, the laptop only that it is a multiple of batch_size x grad_accum);
- `gradient_clipping` = max_grad_norm (0: null, no clipping);
- `fp16.enabled` / `bf16.enabled` = precision fp16 / bf16 (DeepSpeed's own mixed precision:
  the model in 16 bits, fp32 master weights in the optimizer, dynamic loss scaling for fp16);
  precision auto runs fp32 under DeepSpeed unless the file enables one of them, which then
  needs the precision spelled out;
- `optimizer` and `scheduler` are refused: the trainer's AdamW (lr, weight_decay) and schedule
  (warmup_steps, schedule) come from `train:` and step the same way under every strategy.

ZeRO rules (section or file): stage 1, 2 or 3 (stage 0 is plain data parallelism: strategy ddp);
parameter offload needs stage 3 (DeepSpeed partitions parameters only there); an offload device
is cpu or none (nvme needs a path on the server: not offered). Keys DeepSpeed does not know (a typo
DeepSpeed would ignore, or refuse only on the server) are refused with the closest known name.

Contract: standard library only (the laptop imports it); no file is read here — callers pass the
text. Every refusal is a `Problem` (line 0: no line in the file applies), raised together as
`ZeroConfigError` by `build`.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass

AUTO = "auto"

# DeepSpeed 0.19's top-level config keys (deepspeed/runtime/constants.py and the config-json docs).
TOP_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "bfloat16", "amp", "torch_autocast", "gradient_clipping", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "zero_optimization", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown",
    "flops_profiler", "activation_checkpointing", "aio", "communication_data_type",
    "seq_parallel_communication_data_type", "autotuning", "comms_logger", "tensorboard", "wandb", "csv_monitor",
    "comet", "monitor_config", "elasticity", "data_efficiency", "curriculum_learning", "compression_training",
    "checkpoint", "data_types", "disable_allgather", "dataloader_drop_last", "pipeline", "sparse_attention",
    "eigenvalue", "progressive_layer_drop", "quantize_training", "compile", "nebula", "graph_harvesting",
    "use_data_before_expert_parallelism", "hybrid_engine", "weight_quantization", "timers", "zero_quantized_weights",
})
# DeepSpeedZeroConfig's fields (deepspeed/runtime/zero/config.py; DeepSpeed refuses others on the server).
ZERO_KEYS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint",
    "offload_param", "offload_optimizer", "sub_group_size", "cpu_offload_param", "cpu_offload_use_pin_memory",
    "cpu_offload", "prefetch_bucket_size", "stage3_prefetch_bucket_size", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "model_persistence_threshold", "stage3_model_persistence_threshold",
    "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance", "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "module_granularity_threshold", "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params", "allgather_sequential",
    "stage3_allgather_sequential", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "leaf_module", "compute_grad_norm", "parameter_alignment",
    "save_muon_momentum_buffer_in_memory", "zenflow",
})
OFFLOAD_KEYS = {
    "offload_optimizer": frozenset({"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
                                    "fast_init", "ratio", "cpuadam_cores_perc", "super_offload"}),
    "offload_param": frozenset({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"}),
}
OWNED = {"optimizer": "the trainer's AdamW (train.lr, train.weight_decay)",
         "scheduler": "the trainer's schedule (train.warmup_steps, train.schedule)"}


class ZeroConfigError(ValueError):
    """The DeepSpeed config cannot run; `problems` holds every reason."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(p.text() for p in problems))


@dataclass(frozen=True)
class Problem:
    """One refusal: `key` the dotted key in the DeepSpeed config ("" for the whole file), `line`
    its line in the file (0: none, e.g. a `train.deepspeed` mapping, or the job's own field)."""

    key: str
    message: str
    line: int = 0
    column: int = 0

    def text(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.key + ': ' if self.key else ''}{self.message}"


@dataclass(frozen=True)
class JobValues:
    """What `train:` says about the settings DeepSpeed also has. `precision` is the job's text
    (auto, fp32, fp16, bf16) on the laptop, the resolved one (fp32, fp16, bf16) in the trainer;
    `world_size` is known only in the trainer (None on the laptop)."""

    batch_size: int
    grad_accum: int
    max_grad_norm: float | None
    precision: str
    world_size: int | None = None


@dataclass(frozen=True)
class Zero:
    """The ZeRO settings of a `train.deepspeed` mapping (its fields, without the file)."""

    stage: int = 2
    offload_optimizer: bool = False
    offload_params: bool = False


def read_json(text: str) -> tuple[dict | None, list[Problem]]:
    """(the file's object, []) or (None, [the syntax error at its line and column])."""
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [Problem("", f"not valid JSON: {exc.msg}", exc.lineno, exc.colno)]
    if not isinstance(loaded, dict):
        return None, [Problem("", f"a DeepSpeed config is a JSON object, not {type(loaded).__name__}", 1, 1)]
    return loaded, []


def _line_of(text: str, path: tuple[str, ...]) -> int:
    """The line of the last key of `path` in `text`, found as each key's first `"key":` after its
    parent's (the file parsed already; enough to point a person at it). 0 if not found."""
    pos = 0
    for key in path:
        found = re.compile(r'"' + re.escape(key) + r'"\s*:').search(text, pos)
        if found is None:
            return 0
        pos = found.start()
    return text.count("\n", 0, pos) + 1


def _unknown(keys: object, known: frozenset[str], where: tuple[str, ...], text: str) -> list[Problem]:
    if not isinstance(keys, dict):
        return []
    out = []
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(Problem(".".join((*where, key)), f"not a DeepSpeed {'.'.join(where) or 'config'} key{hint}",
                               _line_of(text, (*where, key))))
    return out


def _filled(value: object, want: object) -> object:
    return want if value == AUTO else value


def zero_of(config: dict) -> Zero:
    """The ZeRO settings a (checked) DeepSpeed config dict asks for."""
    zero = config.get("zero_optimization") or {}
    device = lambda part: str((zero.get(part) or {}).get("device", "none"))  # noqa: E731
    return Zero(int(zero.get("stage", 0)), device("offload_optimizer") != "none", device("offload_param") != "none")


def from_section(zero: Zero) -> dict:
    """The DeepSpeed config dict of a `train.deepspeed` mapping, before the job's values."""
    section: dict = {"stage": zero.stage}
    if zero.offload_optimizer:
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if zero.offload_params:
        section["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {"zero_optimization": section}


def problems(config: dict, job: JobValues, text: str = "") -> list[Problem]:
    """Every refusal of `config` (a user's file parsed from `text`, or `from_section`'s) with `job`."""
    found = _unknown(config, TOP_KEYS, (), text)
    for key, what in OWNED.items():
        if key in config:
            found.append(Problem(key, f"not used by the built-in trainer: {what} steps the same under every strategy; "
                                 "remove it", _line_of(text, (key,))))
    found += _job_conflicts(config, job, text)
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        found.append(Problem("zero_optimization", "strategy: deepspeed needs a zero_optimization object with a stage (1, 2 or 3)",
                             _line_of(text, ("zero_optimization",))))
        return found
    found += _unknown(zero, ZERO_KEYS, ("zero_optimization",), text)
    stage = zero.get("stage", 0)
    if stage not in (1, 2, 3) or isinstance(stage, bool):
        found.append(Problem("zero_optimization.stage", f"{stage!r}: use 1, 2 or 3 (stage 0 is plain data parallelism: "
                             "strategy: ddp)", _line_of(text, ("zero_optimization", "stage"))))
    for part in ("offload_optimizer", "offload_param"):
        sub = zero.get(part)
        if sub is None:
            continue
        where = ("zero_optimization", part)
        if not isinstance(sub, dict):
            found.append(Problem(".".join(where), "an object such as {\"device\": \"cpu\"}", _line_of(text, where)))
            continue
        found += _unknown(sub, OFFLOAD_KEYS[part], where, text)
        if sub.get("device", "none") not in ("cpu", "none"):
            found.append(Problem(".".join((*where, "device")), f"{sub.get('device')!r}: use cpu or none (nvme is not offered)",
                                 _line_of(text, (*where, "device"))))
    if zero_of(config).offload_params and stage != 3:
        found.append(Problem("zero_optimization.offload_param", f"parameter offload needs ZeRO stage 3 (stage is {stage}): "
                             "only stage 3 partitions the parameters", _line_of(text, ("zero_optimization", "offload_param"))))
    return found


def _job_conflicts(config: dict, job: JobValues, text: str) -> list[Problem]:
    """The file's batch, accumulation, clipping and precision against the job's (see the module doc)."""
    found = []
    want = {"train_micro_batch_size_per_gpu": ("batch_size", job.batch_size),
            "gradient_accumulation_steps": ("grad_accum", job.grad_accum),
            "gradient_clipping": ("max_grad_norm", job.max_grad_norm or 0.0)}
    for key, (field, value) in want.items():
        if key in config and config[key] != AUTO and config[key] != value:
            found.append(Problem(key, f"{config[key]!r} differs from train.{field} ({value}): set \"auto\" or leave it out "
                                 f"(train.{field} decides)", _line_of(text, (key,))))
    total = config.get("train_batch_size", AUTO)
    per_world = job.batch_size * job.grad_accum
    if total != AUTO:
        wrong = not isinstance(total, int) or isinstance(total, bool) or total % per_world or \
            (job.world_size is not None and total != per_world * job.world_size)
        if wrong:
            world = f"x {job.world_size} processes = {per_world * job.world_size}" if job.world_size else "x the processes"
            found.append(Problem("train_batch_size", f"{total!r} is not train.batch_size x train.grad_accum ({per_world}) "
                                 f"{world}: set \"auto\" or leave it out", _line_of(text, ("train_batch_size",))))
    for half in ("fp16", "bf16"):
        section = config.get(half)
        enabled = section.get("enabled", False) if isinstance(section, dict) else None
        if enabled is True and job.precision != half:
            found.append(Problem(f"{half}.enabled", f"true, but train.precision is {job.precision}: set train.precision: "
                                 f"{half} (the trainer decides DeepSpeed's precision from it)", _line_of(text, (half, "enabled"))))
        if enabled is False and job.precision == half:
            found.append(Problem(f"{half}.enabled", f"false, but train.precision is {half}: set it \"auto\" or true",
                                 _line_of(text, (half, "enabled"))))
    if "bfloat16" in config:
        found.append(Problem("bfloat16", "use bf16 (the same section under its current name)", _line_of(text, ("bfloat16",))))
    return found


def build(config: dict, job: JobValues, text: str = "") -> dict:
    """The config the trainer runs: `config` (a file's or `from_section`'s) with the job's values
    in place of "auto" or absent keys; `job.precision` is the resolved one. Raises
    `ZeroConfigError` with every problem. ZeRO-3 gathers no 16-bit weights on save (the trainer
    writes its own fp32 consolidation)."""
    found = problems(config, job, text)
    if found:
        raise ZeroConfigError(found)
    out = {k: v for k, v in config.items()}
    out["train_micro_batch_size_per_gpu"] = job.batch_size
    out["gradient_accumulation_steps"] = job.grad_accum
    out["gradient_clipping"] = job.max_grad_norm or 0.0
    if job.world_size is not None:
        out["train_batch_size"] = job.batch_size * job.grad_accum * job.world_size
    else:
        out.pop("train_batch_size", None)
    for half in ("fp16", "bf16"):
        section = {k: v for k, v in (config.get(half) or {}).items()} if isinstance(config.get(half), dict) else {}
        section["enabled"] = job.precision == half
        out[half] = {k: _filled(v, None) for k, v in section.items() if _filled(v, None) is not None}
    zero = {k: v for k, v in config["zero_optimization"].items() if v != AUTO}
    out["zero_optimization"] = zero
    out.setdefault("steps_per_print", 1 << 30)  # the trainer logs its own steps
    out.setdefault("wall_clock_breakdown", False)
    return out
