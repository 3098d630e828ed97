"""fanout (the checkpoint fan-out of a multi-node resume): the plan and the checks as pure
functions, then the transfer itself under real torchrun and gloo, with 4 processes whose job
folders stand for three filesystems (the 2-node job through orch: tests/e2e/multinode/test_multinode_resume.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from remote_payload.trainer import fanout
from remote_payload.trainer.checkpoint import COMPLETE
from tests.support.trainer import REPO, trainer_env

DRIVER = """\
import json, logging, os, sys
from pathlib import Path
from remote_payload.contract.train_config import TrainSetupError
from remote_payload.trainer import distributed, fanout
logging.basicConfig(level=logging.INFO, format="%(message)s")
fanout.CHUNK_BYTES = 1000  # several chunks per file
base, layout = Path(sys.argv[1]), json.loads(sys.argv[2])
info = distributed.setup()
try:
    out = base / layout[info.rank]
    results = []
    for _ in range(2):  # the second call finds the step everywhere: nothing to send
        try:
            ckpt = fanout.share_latest(out, info)
            results.append(ckpt and ckpt.name)
        except TrainSetupError as exc:
            results.append(f"error: {exc}")
    (base / f"result-{info.rank}.json").write_text(json.dumps(results))
finally:
    distributed.cleanup()
"""


def make_checkpoint(out: Path, step: int, payload: bytes) -> Path:
    folder = out / "checkpoints" / f"step-{step}"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(payload)
    (folder / "sub" / "rng.pt").write_bytes(payload[::-1][:1500])
    (folder / "empty.json").write_bytes(b"")
    (folder / COMPLETE).write_text(f"step {step}\n")
    return folder


def share(tmp_path: Path, layout: list[str]) -> tuple[dict[int, list], str]:
    """Run the driver under torchrun with len(layout) processes; rank r's job folder is tmp_path/layout[r]."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(len(layout)), str(driver), str(tmp_path), json.dumps(layout)],
                          cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {rank: json.loads((tmp_path / f"result-{rank}.json").read_text()) for rank in range(len(layout))}
    return results, proc.stderr


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_plan_takes_the_newest_step_and_one_writer_per_filesystem_lacking_it() -> None:
    assert fanout.plan([None, None], [0, 0]) is None
    # ranks 0,1 share a folder without checkpoints; rank 2 wrote step 8; rank 3 has only step 4
    p = fanout.plan([None, None, 8, 4], [0, 0, 2, 3])
    assert (p.step, p.source, p.writers, p.members) == (8, 2, (0, 3), [0, 2, 3])
    # the newest on two folders: the lowest rank sends; a folder that has it gets nothing
    p = fanout.plan([8, 8, None, 8], [0, 0, 2, 3])
    assert (p.source, p.writers) == (0, (2,))
    assert fanout.plan([8, 8], [0, 0]).writers == ()


def test_listing_and_verify_catch_a_missing_short_or_altered_file(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 3, bytes(range(256)) * 10)
    entries = fanout.listing(folder)
    assert [e.name for e in entries] == ["empty.json", "model.safetensors", "sub/rng.pt"]  # COMPLETE is not listed
    assert fanout.verify(folder, entries) == []
    (folder / "model.safetensors").write_bytes(b"x" + bytes(range(256)) * 10)
    (folder / "sub" / "rng.pt").write_bytes(b"y" * 1500)
    (folder / "empty.json").unlink()
    assert fanout.verify(folder, entries) == ["empty.json: missing", "model.safetensors: 2561 bytes, expected 2560",
                                                 "sub/rng.pt: sha256 differs"]
    assert not fanout.safe_name("../x") and not fanout.safe_name("/etc/x") and fanout.safe_name("a/b.pt")


def test_the_newest_checkpoint_reaches_every_filesystem_verified(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 17  # 4352 bytes: 5 chunks of 1000
    source = make_checkpoint(tmp_path / "b", 4, payload)
    make_checkpoint(tmp_path / "c", 2, payload[:100])  # an older one: it gets the newer too
    results, log = share(tmp_path, ["a", "a", "b", "c"])
    assert results == {r: ["step-4", "step-4"] for r in range(4)}
    for folder in ("a", "c"):
        got = tmp_path / folder / "checkpoints"
        assert tree(got / "step-4") == tree(source)
        assert sorted(p.name for p in got.iterdir()) == (["step-2", "step-4"] if folder == "c" else ["step-4"])
    assert log.count("fanned out checkpoint step-4 from rank 2") == 1  # the second call sent nothing
    assert "to rank 0 (" in log and "rank 3 (" in log and "3 files, 5,852 bytes" in log


def test_a_writer_that_cannot_write_fails_the_start_on_every_rank_without_a_hang(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "b", 4, b"z" * 3000)
    (tmp_path / "a" / "checkpoints").mkdir(parents=True)
    (tmp_path / "a" / "checkpoints" / "tmp-recv-4").write_text("a file where the folder must go")
    results, _ = share(tmp_path, ["a", "b"])
    for rank in (0, 1):
        first = results[rank][0]
        assert first.startswith("error: sharing checkpoint step-4 from rank 1 (") and "failed on rank 0" in first
        assert "cannot create" in first
    assert not (tmp_path / "a" / "checkpoints" / "step-4").exists()
