"""``launch.slurm`` in job.yaml: what a job asks a Slurm cluster for (docs/slurm.md).

Only used when the job's host is a Slurm login node (``orch hosts add --scheduler slurm``);
on an SSH box the section is ignored with a warning. Values are checked here with the same
rules the server's batch-script writer applies (``remote_payload.contract.slurm``), so a typo is exit 2
with file:line before anything connects.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from remote_payload.contract import slurm


class SlurmJob(BaseModel):
    """Per-job Slurm resources; partition/account/qos override the host's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time: str | None = Field(None, description="Time limit (`--time`): minutes, H:M:S or D-H:M:S; default: the "
                             "partition's.")
    mem: str | None = Field(None, description="Memory per node (`--mem`), e.g. 64G; default: the cluster's.")
    cpus_per_task: int | None = Field(None, ge=1, le=100_000, description="CPUs for each node's torchrun "
                                      "(`--cpus-per-task`); default: the cluster's.")
    gpus_per_node: int | None = Field(None, ge=0, le=1024, description="GPUs per node (`--gres=gpu:N`); default: "
                                      "launch.nproc_per_node when a number, else every GPU of the partition's nodes.")
    partition: str | None = Field(None, pattern=slurm.NAME_PATTERN, description="Overrides the host's partition.")
    account: str | None = Field(None, pattern=slurm.NAME_PATTERN, description="Overrides the host's account.")
    qos: str | None = Field(None, pattern=slurm.NAME_PATTERN, description="Overrides the host's QoS.")
    requeue: bool = Field(False, description="At the time-limit warning checkpoint and go back to the queue: the "
                          "next allocation continues from the checkpoint.")
    signal_before_s: int = Field(120, ge=0, le=65535, description="Seconds before the time limit at which the job "
                                 "is told to checkpoint (SIGUSR1 to orch, SIGTERM to the job); 0: no warning.")

    @field_validator("time", mode="before")
    @classmethod
    def _time_text(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):  # YAML reads 1:00:00 unquoted as 3600
            raise ValueError(f"write the time limit quoted, e.g. time: '{value}' for {value} minutes or "
                             "time: '1:00:00' (unquoted, YAML reads 1:00:00 as the number 3600)")
        return value

    @field_validator("mem", mode="before")
    @classmethod
    def _mem_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value  # MB, as --mem

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            slurm.time_seconds(value)
        return value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None:
            slurm.mem_mb(value)
        return value

    @model_validator(mode="after")
    def _warning_before_limit(self) -> "SlurmJob":
        limit = slurm.time_seconds(self.time) if self.time else None
        if limit is not None and self.signal_before_s >= limit:
            raise ValueError(f"signal_before_s ({self.signal_before_s}) must be shorter than the time limit "
                             f"{self.time} ({limit} s)")
        return self
