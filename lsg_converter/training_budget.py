"""How the long-document adaptation's training fits its time budget (see `adaptation.py`): the learning-rate
plan, made on the steps the epochs hold and made again on the steps the budget buys once the first step is
timed; the callback that times it and stops the training when the next step would not fit; and the
training's progress bar and logs, which follow transformers' logging switches (`lsg-convert --quiet`)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from transformers import TrainerCallback
from transformers.utils import logging

logger = logging.get_logger(__name__)

WARMUP_SHARE = 0.1  # of the planned steps, over which the learning rate rises to its peak


class LearningRatePlan:
    """A linear warm-up over the first `WARMUP_SHARE` of the planned steps, then the peak learning rate
    (constant): step s (from 0) runs at min(1, (s + 1) / (warmup_steps + 1)) of the peak, so that no step
    runs at 0. `plan` sets the planned steps again; the steps still to come follow the new plan."""

    def __init__(self) -> None:
        self.planned_steps = 0
        self.warmup_steps = 0

    def plan(self, steps: int) -> None:
        """Plan the warm-up on `steps` steps."""
        self.planned_steps = steps
        self.warmup_steps = math.ceil(WARMUP_SHARE * steps)

    def factor(self, step: int) -> float:
        """The share of the peak learning rate step `step` (from 0) runs at."""
        return min(1.0, (step + 1) / (self.warmup_steps + 1))


def planned_trainer(plan: LearningRatePlan, cards_the_training: bool) -> type:
    """A SentenceTransformerTrainer class whose learning rate follows `plan`, first planned on the steps the
    trainer counts for its epochs (or max_steps). Without `cards_the_training`, the trainer leaves out
    sentence-transformers' model card callback (what the card it writes on save says of the training; its
    widget examples, taken from the texts, come with a progress bar that no switch hides)."""
    from sentence_transformers import SentenceTransformerTrainer

    class PlannedTrainer(SentenceTransformerTrainer):
        def add_model_card_callback(self, default_args_dict: dict[str, Any]) -> None:
            if cards_the_training:
                super().add_model_card_callback(default_args_dict)

        def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
            if self.lr_scheduler is None:
                plan.plan(num_training_steps)
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, plan.factor)
            return self.lr_scheduler

    return PlannedTrainer


class TimeBudget(TrainerCallback):
    """Fits the training into `minutes` from its start: times its first step, plans the learning rate (`plan`)
    on the steps the budget then buys and says so before the next step, and stops the training after a step
    when the next one, at the mean time of those done, would not fit. `clock`: the time source, in seconds."""

    def __init__(
        self, minutes: float | None, plan: LearningRatePlan, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.minutes, self.plan, self.clock = minutes, plan, clock
        self.started = self.first_step_started = clock()

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.clock()

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.first_step_started = self.clock()

    def on_optimizer_step(self, args, state, control, **kwargs):
        """After the first step's optimizer step, before the learning rate of the second is set."""
        if self.minutes is None or state.global_step != 0:
            return
        now = self.clock()
        step_seconds, left = now - self.first_step_started, self.minutes * 60 - (now - self.started)
        budget_steps = 1 + int(left // step_seconds) if step_seconds > 0 else state.max_steps
        if budget_steps < 1:
            logger.warning(
                f"The first step took {_seconds(step_seconds)} s, more than max_minutes={self.minutes:.3g}: the "
                "adaptation stops after it; give more minutes or fewer documents per step (batch_size=)."
            )
        elif budget_steps < state.max_steps:
            self.plan.plan(budget_steps)
            logger.warning(
                f"The first step took {_seconds(step_seconds)} s: max_minutes={self.minutes:.3g} buys {budget_steps} of "
                f"the {state.max_steps} planned steps; the learning rate warms up over {self.plan.warmup_steps} of them."
            )
        else:
            logger.info(
                f"The first step took {_seconds(step_seconds)} s: max_minutes={self.minutes:.3g} holds the "
                f"{state.max_steps} planned steps."
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.minutes is None:
            return
        now = self.clock()
        step_seconds = (now - self.first_step_started) / state.global_step
        if now - self.started + step_seconds > self.minutes * 60:
            logger.info(f"The adaptation stops after {state.global_step} steps: its {self.minutes:.3g} minutes are up.")
            control.should_training_stop = True
        return control


def _seconds(seconds: float) -> str:
    """A step's time as its message says it: whole seconds from 10 s, two figures below."""
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.2g}"


class TrainingProgress(TrainerCallback):
    """The training's progress bar (transformers' tqdm: `transformers.utils.logging.disable_progress_bar()`
    hides it) and its logged values as info logs, in place of the trainer's bar and the dicts it prints."""

    def __init__(self) -> None:
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = logging.tqdm(total=state.max_steps, desc="adapting", unit="step")

    def on_step_end(self, args, state, control, **kwargs):
        self.bar.update(1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        values = (
            f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}" for name, value in logs.items()
        )
        logger.info(f"Step {state.global_step}: {', '.join(values)}")

    def on_train_end(self, args, state, control, **kwargs):
        self.bar.close()
