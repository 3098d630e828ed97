"""The GPU queue's inventory read from captured nvidia-smi output (gpuqueue/inventory.py).

A stand-in `nvidia-smi` on PATH prints text in the shape real nvidia-smi prints for the queue's
two queries (`--format=csv,noheader,nounits`), or fails as it fails, and `inventory` runs it as a
real process. The captures are the cases a server meets: several GPUs with memory and processes
of others, a MIG-enabled GPU, a container whose PID namespace hides every process (memory in use,
nothing listed), a MIG slice in a container (memory fields [N/A]), a GPU that needs a reset,
Windows line ends, no GPU ("No devices were found", exit 6), a driver/library mismatch (exit 18),
and the server's CUDA_VISIBLE_DEVICES naming indices, MIG instances or uuids.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from remote_payload.gpuqueue import inventory as gpuinventory

UUID = ["GPU-5d5ba8d5-9c4e-0f7c-6a22-1d3c4b6c9a01", "GPU-0b1ad7e2-77a3-5b4e-a8c1-94f0e3b2c7d2",
        "GPU-a7c9e0f4-3e21-4d6b-9b5a-2f8e1c0d4e63", "GPU-e3f2a1b0-1c2d-4e5f-8a9b-7c6d5e4f3a24"]
GPUS = "--query-gpu=index,uuid,memory.total,memory.used"
APPS = "--query-compute-apps=gpu_uuid,pid"

# name: ({query: (exit code, stdout)}, expected [(index, total_mib, used_mib, apps)], busy per GPU)
CAPTURES = {
    "four H100, two in use by others": ({
        GPUS: (0, "".join(f"{i}, {UUID[i]}, 81559, {used}\n" for i, used in enumerate([1, 74213, 3, 612]))),
        APPS: (0, f"{UUID[1]}, 18211\n{UUID[1]}, 18240\n{UUID[3]}, 30511\n"),
    }, [(0, 81559, 1, 0), (1, 81559, 74213, 2), (2, 81559, 3, 0), (3, 81559, 612, 1)], [False, True, False, True]),
    "MIG-enabled A100: processes listed under the parent GPU": ({
        GPUS: (0, f"0, {UUID[0]}, 81920, 24224\n1, {UUID[1]}, 81920, 13\n"),
        APPS: (0, f"{UUID[0]}, 4101\n{UUID[0]}, 4177\n"),
    }, [(0, 81920, 24224, 2), (1, 81920, 13, 0)], [True, False]),
    "container: other tenants' memory in use, no process listed": ({
        GPUS: (0, f"0, {UUID[0]}, 97871, 40211\n1, {UUID[1]}, 97871, 0\n"),
        APPS: (0, ""),
    }, [(0, 97871, 40211, 0), (1, 97871, 0, 0)], [True, False]),
    "MIG slice in a container: memory fields [N/A]": ({
        GPUS: (0, f"0, {UUID[0]}, [N/A], [N/A]\n"),
        APPS: (0, ""),
    }, [(0, None, None, 0)], [False]),
    "a GPU that needs a reset, Windows line ends": ({
        GPUS: (0, f"0, {UUID[0]}, 24564, 812\r\n1, {UUID[1]}, [GPU requires reset], [GPU requires reset]\r\n"
                  "[Unknown Error], [Unknown Error], [Unknown Error], [Unknown Error]\r\n"),
        APPS: (0, f"{UUID[1]}, [Insufficient Permissions]\r\n"),
    }, [(0, 24564, 812, 0), (1, None, None, 1)], [False, True]),
    "no GPU: No devices were found (exit 6)": ({
        GPUS: (6, "No devices were found\n"), APPS: (6, "No devices were found\n"),
    }, [], []),
    "driver/library version mismatch (exit 18)": ({
        GPUS: (18, "Failed to initialize NVML: Driver/library version mismatch\n"),
        APPS: (18, "Failed to initialize NVML: Driver/library version mismatch\n"),
    }, [], []),
    "the process list fails: GPUs still listed": ({
        GPUS: (0, f"0, {UUID[0]}, 16384, 0\n"), APPS: (9, "Unable to query processes\n"),
    }, [(0, 16384, 0, 0)], [False]),
}


def _stand_in(folder: Path, answers: dict[str, tuple[int, str]]) -> None:
    """An executable `nvidia-smi` in `folder` answering the two queries; anything else exits 2."""
    folder.mkdir(parents=True, exist_ok=True)
    for n, (query, (_, out)) in enumerate(answers.items()):
        (folder / f"out{n}").write_bytes(out.encode())
    cases = "".join(f'  "{q} --format=csv,noheader,nounits") cat "$here/out{n}"; exit {rc} ;;\n'
                    for n, (q, (rc, _)) in enumerate(answers.items()))
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\nhere=$(dirname "$0")\ncase "$*" in\n{cases}  *) echo "bad args: $*" >&2; exit 2 ;;\nesac\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install captures as the nvidia-smi on PATH; returns a reader of the inventory."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(answers: dict[str, tuple[int, str]]) -> None:
        bin_dir = tmp_path / f"bin{len(list(tmp_path.glob('bin*')))}"
        _stand_in(bin_dir, answers)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def read() -> dict:
        return gpuinventory.inventory(str(tmp_path / f"gpus{len(list(tmp_path.glob('gpus*')))}" / "gpus.json"))

    return install, read


@pytest.mark.parametrize("name", list(CAPTURES))
def test_captured_nvidia_smi_output_is_read(smi, name: str) -> None:
    answers, expected, busy = CAPTURES[name]
    install, read = smi
    install(answers)
    record = read()
    assert record["source"] == "nvidia-smi" and gpuinventory.recorded(record)
    got = [(g["index"], g["total_mib"], g["used_mib"], g["apps"]) for g in record["gpus"]]
    assert got == expected
    assert [g["uuid"] for g in record["gpus"]] == [UUID[i] for i, *_ in expected]
    assert [gpuinventory.busy(g) for g in record["gpus"]] == busy


@pytest.mark.parametrize(("visible", "indices"), [("1,3", [1, 3]), ("2", [2]), ("", [0, 1, 2, 3]),
                                                  (f"MIG-{UUID[0][4:]}", [0, 1, 2, 3]), (UUID[2], [0, 1, 2, 3])])
def test_the_servers_cuda_visible_devices_filters_indices_only(smi, monkeypatch: pytest.MonkeyPatch, visible: str,
                                                               indices: list[int]) -> None:
    """Indices filter; an empty value, MIG instances and uuids name no index: every GPU stays listed."""
    install, read = smi
    install(CAPTURES["four H100, two in use by others"][0])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [g["index"] for g in read()["gpus"]] == indices


def test_a_hung_nvidia_smi_is_bounded(smi, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    install, read = smi
    install(CAPTURES["four H100, two in use by others"][0])
    hung = tmp_path / "hung"
    hung.mkdir()
    (hung / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 30\n")
    (hung / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{hung}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpuinventory, "SMI_TIMEOUT_S", 0.5)
    assert read()["gpus"] == []
