"""``orch plot``'s drawing (orchestrator/display/plot.py): each attempt, and each run of rows
after the step went down, is its own segment, so no line goes back in time; a panel with no
points is left out."""

from __future__ import annotations

import json

import pytest

from orchestrator.display.plot import draw, overlay, parse_metrics, save_plot, segments
from orchestrator.errors import UsageError


def rows_of(*rows: dict) -> list[dict[str, float]]:
    return parse_metrics("\n".join(json.dumps(r) for r in rows))


def lines_of(ax) -> list[list[float]]:
    return [list(line.get_xdata()) for line in ax.lines]


# attempt 1 trains to step 30 and dies; attempt 2 resumes from the checkpoint at step 20
TWO_ATTEMPTS = rows_of(
    *({"step": s, "loss": 3 - s / 20, "lr": 1e-3, "attempt": 1} for s in (10, 20, 30)),
    {"step": 20, "eval_loss": 2.5, "attempt": 1},
    *({"step": s, "loss": 2 - s / 40, "lr": 1e-3, "attempt": 2} for s in (20, 30, 40)),
    {"step": 40, "eval_loss": 2.0, "attempt": 2},
)


def test_segments_split_at_a_new_attempt_or_a_step_that_goes_down() -> None:
    assert segments(TWO_ATTEMPTS, "loss") == [([10.0, 20.0, 30.0], [2.5, 2.0, 1.5]), ([20.0, 30.0, 40.0], [1.5, 1.25, 1.0])]
    assert segments(TWO_ATTEMPTS, "eval_loss") == [([20.0], [2.5]), ([40.0], [2.0])]
    # no attempt key (an older file, or a script restarting itself): the step going down splits
    restarted = rows_of(*({"step": s, "loss": 1.0} for s in (1, 2, 3, 2, 3, 3, 4)))
    assert [xs for xs, _ in segments(restarted, "loss")] == [[1.0, 2.0, 3.0], [2.0, 3.0, 3.0, 4.0]]
    # rows without the key are skipped, not a break; a first attempt row after unmarked ones is new
    mixed = rows_of({"step": 1, "loss": 1.0}, {"step": 2, "lr": 0.1}, {"step": 3, "loss": 1.0},
                    {"step": 4, "loss": 1.0, "attempt": 2})
    assert [xs for xs, _ in segments(mixed, "loss")] == [[1.0, 3.0], [4.0]]
    assert segments(mixed, "tokens_per_s") == []


def test_draw_keeps_attempts_apart_and_labels_each_series_once() -> None:
    fig = draw(TWO_ATTEMPTS, "job")
    ax_loss, ax_lr = fig.axes  # no tokens/s: no empty panel for it
    assert lines_of(ax_loss) == [[10.0, 20.0, 30.0], [20.0, 30.0, 40.0], [20.0], [40.0]]
    assert [line.get_color() for line in ax_loss.lines] == ["C0", "C0", "C1", "C1"]
    assert [t.get_text() for t in ax_loss.get_legend().get_texts()] == ["train loss", "eval loss"]
    assert lines_of(ax_lr) == [[10.0, 20.0, 30.0], [20.0, 30.0, 40.0]]
    assert ax_lr.get_xlabel() == "step" and ax_loss.get_ylabel() == "loss" and ax_lr.get_ylabel() == "lr"
    assert tuple(fig.get_size_inches()) == (8.0, 7.0)
    for xs in lines_of(ax_loss) + lines_of(ax_lr):
        assert xs == sorted(xs)  # never a line drawn back in time


@pytest.mark.parametrize("keys, panels, height", [
    (("loss",), ["loss"], 5.0),
    (("eval_loss",), ["loss"], 5.0),
    (("loss", "tokens_per_s"), ["loss", "tokens/s"], 7.0),
    (("lr",), ["lr"], 5.0),
    (("loss", "lr", "tokens_per_s"), ["loss", "lr", "tokens/s"], 9.0),
])
def test_panels_without_points_are_left_out(keys: tuple[str, ...], panels: list[str], height: float) -> None:
    rows = rows_of(*({"step": s, **{k: 1.0 + s for k in keys}} for s in range(3)))
    fig = draw(rows, "job")
    assert [ax.get_ylabel() for ax in fig.axes] == panels
    assert fig.get_size_inches()[1] == height and fig.axes[-1].get_xlabel() == "step"
    assert all(ax.lines for ax in fig.axes)


def test_save_plot_refuses_rows_with_nothing_to_draw(tmp_path) -> None:
    with pytest.raises(UsageError, match="no loss, eval loss, lr or tokens/s"):
        save_plot(rows_of({"step": 1, "epoch": 0.5}), "job", tmp_path / "c.png")
    save_plot(rows_of({"step": 1, "loss": 2.0}), "job", tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_overlay_draws_each_jobs_attempts_as_segments() -> None:
    other = rows_of(*({"step": s, "loss": 1.0} for s in (5, 10)))
    fig = overlay([("a", TWO_ATTEMPTS), ("b", other)], "2 jobs")
    ax_train, ax_eval = fig.axes
    assert lines_of(ax_train) == [[10.0, 20.0, 30.0], [20.0, 30.0, 40.0], [5.0, 10.0]]
    assert [line.get_color() for line in ax_train.lines] == ["C0", "C0", "C1"]
    assert lines_of(ax_eval) == [[20.0], [40.0]]
    assert [t.get_text() for t in ax_train.get_legend().get_texts()] == ["a", "b"]
