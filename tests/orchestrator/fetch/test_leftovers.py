"""An earlier attempt's checkpoint fetched beside the newer one is named
(orchestrator/fetch/leftovers.py): Lightning's ``last.ckpt`` beside ``last-vK.ckpt``, the
highest version the newest run's, in each folder on its own; other ``-vK`` names are one run's
own versions and never named. The whole path through ``orch fetch``:
tests/e2e/daily/test_resume_layouts.py."""

from __future__ import annotations

from orchestrator.fetch.leftovers import Leftover, leftovers, lines


def test_every_last_ckpt_below_the_highest_version_of_its_folder_is_named() -> None:
    names = ["ckpt/last.ckpt", "ckpt/last-v2.ckpt", "ckpt/last-v1.ckpt", "ckpt/epoch=0-step=3.ckpt",
             "ckpt/epoch=0-step=3-v1.ckpt", "other/last.ckpt", "last.ckpt", "last-v1.ckpt", "notlast-v1.ckpt",
             "ckpt/last.ckpt.part"]
    found = leftovers(names)
    assert found == [Leftover("last.ckpt", "last-v1.ckpt"), Leftover("ckpt/last.ckpt", "ckpt/last-v2.ckpt"),
                     Leftover("ckpt/last-v1.ckpt", "ckpt/last-v2.ckpt")]
    said = lines(found)
    assert said[0].startswith("an earlier attempt's checkpoints came back beside the newer one")
    assert said[1:] == ["  last.ckpt  (older than last-v1.ckpt)", "  ckpt/last.ckpt  (older than ckpt/last-v2.ckpt)",
                        "  ckpt/last-v1.ckpt  (older than ckpt/last-v2.ckpt)"]
    assert leftovers(["ckpt/last.ckpt", "other/last-v1.ckpt"]) == [] and lines([]) == []
    many = lines(leftovers([f"d{i}/last.ckpt" for i in range(7)] + [f"d{i}/last-v1.ckpt" for i in range(7)]))
    assert len(many) == 1 + 5 + 1 and many[-1] == "  +2 more"
