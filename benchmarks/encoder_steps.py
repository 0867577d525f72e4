"""The calls the encoder benchmarks time and measure: one forward pass or one training step of a model on random
token ids (bench_t5 and bench_modernbert)."""

from __future__ import annotations

from typing import Callable

import torch


def step_function(model: torch.nn.Module, length: int, step: str, token_ids_below: int) -> Callable[[], None]:
    """One forward pass (`step` "forward": eval, no grad) or one training step ("train": train mode, forward +
    backward of the mean square of the last hidden states, gradients set to None after it) on one row of `length`
    random token ids in [5, `token_ids_below`) (seed 0), on the model's device (waited for on CUDA)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, token_ids_below, (1, length), generator=generator).to(device)
    wait = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            model(input_ids=input_ids)
        wait()

    def train_step() -> None:
        model.train()
        model(input_ids=input_ids).last_hidden_state.float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
        wait()

    return forward if step == "forward" else train_step
