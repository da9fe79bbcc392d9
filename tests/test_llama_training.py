"""Notebook 07's training cells, run alone on a tiny model with the reference answers.

* The windows it trains on make ``lm_loss`` score every position the cropped
  ``generate`` predicts from, 0 to max_seq_len - 1 (windows of max_seq_len
  characters would leave out the last).
* The loop runs the whole schedule; when it runs out of processor time it says
  that it stopped, after how many of its steps, and that the schedule is unfinished.
* The next cell keeps the trained model for notebook 08, beside the notebook folders.

The whole notebook runs in test_notebooks.py (250 steps, about a minute).
"""

import math
import time

import pytest
import torch
from notebook_runner import solution_cell
from tqdm.auto import tqdm

from autograder import reference
from course_widgets import explain_unfinished
from course_widgets.model import TRAINED_MODEL, TrainingMonitor, load_trained_model, save_trained_model

NOTEBOOK = "07_llama"
TRAINING_CELL = "def get_batch(source"
BLOCK_SIZE = 16
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ref():
    return reference.load(NOTEBOOK)


@pytest.fixture
def training(ref):
    """What the training cell finds defined in the notebook, for a tiny model with a context of 16."""

    def namespace(steps, max_cpu_seconds):
        torch.manual_seed(0)
        data = torch.randint(0, 12, (2_000,))
        config = ref.ModelConfig(12, 16, 1, 2, 1, 32, max_seq_len=BLOCK_SIZE)
        return dict(
            torch=torch,
            math=math,
            time=time,
            tqdm=tqdm,
            explain_unfinished=explain_unfinished,
            lm_loss=ref.lm_loss,
            lr_at=ref.lr_at,
            model=ref.Llama(config),
            monitor=TrainingMonitor(math.log(12), total_steps=steps),
            train_data=data[:1_800],
            val_data=data[1_800:],
            unigram_entropy=math.log(12),
            steps=steps,
            max_cpu_seconds=max_cpu_seconds,
            eval_batches=1,
            batch_size=4,
            block_size=BLOCK_SIZE,
        )

    return namespace


def run_cell(marker: str, namespace: dict) -> dict:
    exec(compile(solution_cell(NOTEBOOK, marker), f"<{NOTEBOOK} cell>", "exec"), namespace)
    return namespace


def test_training_windows_score_every_position_generate_predicts_from(ref, training):
    namespace = run_cell(TRAINING_CELL, training(steps=0, max_cpu_seconds=60))
    windows = namespace["get_batch"](namespace["train_data"])
    logits = torch.zeros(*windows.shape, 12, requires_grad=True)
    ref.lm_loss(logits, windows).backward()
    scored = (logits.grad.abs().sum(dim=(0, 2)) > 0).nonzero().flatten().tolist()
    # generate feeds the last max_seq_len tokens and predicts from the last of them, position max_seq_len - 1
    assert scored == list(range(BLOCK_SIZE)), scored


def test_while_graded_it_trains_no_steps_and_makes_no_optimizer(training, monkeypatch, capsys):
    """Graded, the notebook trains 0 steps (``grading_now()``): the first AdamW made in a process imports
    much of torch (about a second and 70 MB in each graded kernel), so the cell makes none then."""

    class Counted(torch.optim.AdamW):
        made = 0

        def __init__(self, *args, **kwargs):
            Counted.made += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", Counted)
    namespace = run_cell(TRAINING_CELL, training(steps=0, max_cpu_seconds=60))
    assert Counted.made == 0 and namespace["trained_steps"] == 0 and namespace["model"] is not None
    assert "0 steps in " in capsys.readouterr().out
    run_cell(TRAINING_CELL, training(steps=1, max_cpu_seconds=600))
    assert Counted.made == 1


def test_training_runs_its_whole_schedule(training, capsys):
    namespace = run_cell(TRAINING_CELL, training(steps=3, max_cpu_seconds=600))
    out = capsys.readouterr().out
    assert namespace["trained_steps"] == 3 and namespace["model"] is not None
    assert "3 steps in " in out and "loss on training text" in out and "stopped" not in out


def test_training_out_of_processor_time_says_it_stopped_and_left_the_schedule_unfinished(training, capsys):
    namespace = run_cell(TRAINING_CELL, training(steps=5, max_cpu_seconds=0))
    out = capsys.readouterr().out
    assert namespace["trained_steps"] == 1 and namespace["model"] is not None
    assert "stopped after 1 step (of 5): this kernel used its 0 s of processor time. The schedule is unfinished" in out
    assert "measured after all 5 steps" in out


def test_trained_model_is_kept_beside_the_notebook_folders_for_notebook_08(
    ref, training, tmp_path, monkeypatch, capsys
):
    namespace = run_cell(TRAINING_CELL, training(steps=2, max_cpu_seconds=600))
    (tmp_path / NOTEBOOK).mkdir()
    monkeypatch.chdir(tmp_path / NOTEBOOK)
    run_cell(
        "save_trained_model(model",
        {**namespace, "chars": list("abcdefghijkl"), "save_trained_model": save_trained_model},
    )
    assert capsys.readouterr().out.endswith(f"saved for notebook 08: {tmp_path / TRAINED_MODEL}\n")
    model, chars, steps = load_trained_model(ref.ModelConfig, ref.Llama)
    assert (chars, steps) == (list("abcdefghijkl"), 2)
    tokens = torch.randint(0, 12, (2, 8))
    with torch.no_grad():
        assert torch.equal(model(tokens), namespace["model"].eval()(tokens))
