"""Training scripts written in the style of the upstream ones people launch through orch (the
PyTorch DDP tutorial, accelerate's and DeepSpeed's examples, a Hugging Face examples script, a
bash wrapper), shared by the launcher, resume and multi-node tests. CPU only, gloo.

A DDP script on gloo that ends right after a collective aborts now and then at interpreter exit
under torch 2.13 ("terminate called without an active exception", SIGABRT, after the script's
last line): DDP keeps the process group alive until exit, and a gloo worker thread still
releasing the last collective's work takes the GIL while the interpreter finalizes
(pytorch/pytorch#190489; seen in about 1 of 20 runs on a loaded machine, also without orch).
Those scripts end with ``GLOO_EXIT``: flushed, then ``os._exit(0)``, which skips finalization.
"""

# The end of a DDP-on-gloo script that must not race torch's teardown (see above).
GLOO_EXIT = """\
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # pytorch/pytorch#190489: no finalization for gloo's worker threads to race
"""

# The PyTorch DDP tutorial's shape: DistributedSampler + set_epoch, GradScaler (disabled on the
# CPU: the tutorial's `device_type="cuda"` lines are the only ones changed), rank 0 saves
# ddp_model.module.state_dict(), then barrier().
DDP_TUTORIAL = """\
import os, sys, json
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp_model = DDP(model)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    seen = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp_model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            seen += len(x)
    os.makedirs("outputs", exist_ok=True)
    with open(f"outputs/rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "world": world, "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
                   "seen": seen, "argv": sys.argv[1:], "greeting": os.environ.get("GREETING")}, f)
    if rank == 0:
        torch.save(ddp_model.module.state_dict(), "outputs/model.pth")
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
""" + GLOO_EXIT

ACCELERATE = """\
import json, os, sys
import torch
from accelerate import Accelerator

acc = Accelerator(cpu="--cpu" in sys.argv[1:])  # accelerate's examples: Accelerator(cpu=args.cpu)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(16, 4)), batch_size=2)
model, opt, data = acc.prepare(model, opt, data)
for (x,) in data:
    acc.backward(model(x).sum())
    opt.step()
    opt.zero_grad()
total = acc.reduce(torch.ones(1, device=acc.device) * (acc.process_index + 1), "sum").item()
os.makedirs("outputs", exist_ok=True)
with open(f"outputs/rank{acc.process_index}.json", "w") as f:
    json.dump({"rank": acc.process_index, "world": acc.num_processes, "type": str(acc.distributed_type),
               "sum": total}, f)
acc.wait_for_everyone()
""" + GLOO_EXIT

DEEPSPEED = """\
import json, os
import torch.distributed as dist
import deepspeed  # noqa: F401 (imported as DeepSpeed scripts do; the group is torch's, gloo on the CPU)

dist.init_process_group("gloo")
os.makedirs("outputs", exist_ok=True)
with open("outputs/rank%d.json" % dist.get_rank(), "w") as f:
    json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "local_rank": os.environ["LOCAL_RANK"]}, f)
dist.barrier()
"""

WRAPPER = """\
#!/bin/bash
set -e
echo "python=$(command -v python)"
echo "torchrun=$(command -v torchrun)"
bash -lc 'echo "login-python=$(command -v python)"'
python -c "import torch; print('torch', torch.__version__)"
echo "A=$A"
echo "path-head=${PATH%%:*}"
"""

RESUMABLE = """\
import json, os, pathlib, sys
from remote_payload.report import report

attempt = int(os.environ["ORCH_ATTEMPT"])
out = pathlib.Path("outputs")
out.mkdir(exist_ok=True)
(out / f"attempt{attempt}.json").write_text(json.dumps(sys.argv[1:]))
if attempt == 1:
    ckpt = pathlib.Path("out/checkpoint-7")
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"log_history": [], "max_steps": 20}))
    for step in range(1, 11):
        report(step=step, loss=1.0 / step, total_steps=20)
    sys.exit(3)
for step in range(1, 4):  # this script ignores what it is given: it starts over
    report(step=step, loss=1.0, total_steps=20)
"""

RUN_CLM_STYLE = """\
import json, os, sys
from dataclasses import dataclass, field
import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Trainer, TrainerCallback,
                          TrainingArguments)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a local model folder"})


@dataclass
class DataTrainingArguments:
    train_file: str = field(metadata={"help": "a JSON-lines file of {'text': ...}"})
    block_size: int = 32


class Texts(torch.utils.data.Dataset):
    def __init__(self, tok, path, block_size):
        texts = [json.loads(line)["text"] for line in open(path)][:64]
        self.rows = [tok(t, truncation=True, max_length=block_size, padding="max_length") for t in texts]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = torch.tensor(self.rows[i]["input_ids"])
        return {"input_ids": ids, "attention_mask": torch.tensor(self.rows[i]["attention_mask"]), "labels": ids.clone()}


class Preempted(TrainerCallback):  # the test's stand-in for a crash: attempt 1 ends at step 5
    def on_step_end(self, args, state, control, **kwargs):
        if os.environ.get("ORCH_ATTEMPT") == "1" and state.global_step == 5:
            raise SystemExit(7)


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    tok = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    data = Texts(tok, data_args.train_file, data_args.block_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=data, eval_dataset=data,
                      callbacks=[Preempted()])
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)


if __name__ == "__main__":
    main()
"""
