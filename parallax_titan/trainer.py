"""The training loop: TorchTitan's Trainer with Parallax-Titan's additions.

The training step itself is TorchTitan's (``Trainer.train_step``): forward, loss, backward,
gradient clipping, optimizer and schedule steps. This subclass adapts the host, validates the
config before anything is built, runs the up-training conversion, drives the progress bar, and
handles interruptions (SIGTERM, ``reliability.stop_at_step``) by saving a full checkpoint and
leaving the loop, so that rerunning the command resumes exactly.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from parallax_titan.compat import configure_for_host, save_checkpoint_now
from parallax_titan.diagnostics.runner import DiagnosticsRunner, tensorboard_figure_logger
from parallax_titan.validate import validate_job_config


class FlagToHost:
    """A device flag read on the host without draining the stream behind it.

    ``start(flag)`` queues a copy of the bool scalar ``flag`` (or None: no flag) into pinned host
    memory and records an event; ``get()`` waits for the latest ``start``'s event only, so work
    queued on the stream after it (the optimizer's orthogonalisation) keeps running. CPU tensors
    are read directly.
    """

    def __init__(self) -> None:
        self._host = self._event = self._pinned = None

    def start(self, flag: torch.Tensor | None) -> None:
        if flag is None or not flag.is_cuda:
            self._host, self._event = flag, None
            return
        if self._pinned is None:  # one pinned byte for the run: get() always waits before reuse
            self._pinned = torch.empty((), dtype=torch.bool, pin_memory=True)
        self._host = self._pinned
        self._host.copy_(flag, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def get(self) -> bool:
        """The flag's value (False for no flag or no ``start``); clears it for the next ``start``."""
        if self._event is not None:
            self._event.synchronize()
        value = bool(self._host) if self._host is not None else False
        self._host = self._event = None
        return value


class ParallaxTrainer(Trainer):
    def __init__(self, job_config):
        validate_job_config(job_config)
        configure_for_host(job_config)
        super().__init__(job_config)
        self._stop_reason: str | None = None
        self._sigterm = False
        self._nonfinite = None  # device flag: a non-finite loss or gradient in this step
        self.nonfinite_steps = 0
        reliability = job_config.reliability
        self._flag_to_host = FlagToHost()
        if reliability.nonfinite != "off":
            self.optimizers.step_guard = self._finite_or_skip
        if reliability.save_on_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        # Per-step agreement on stop flags goes through a CPU (gloo) group: no device sync per step.
        multi = dist.is_initialized() and dist.get_world_size() > 1
        self._flag_group = dist.new_group(backend="gloo") if multi else None
        self.diagnostics = DiagnosticsRunner.from_config(job_config, self.tokenizer)
        self._log_figure = tensorboard_figure_logger(self.metrics_processor.logger)
        source = job_config.parallax.init_from_transformer
        if source:
            from parallax_titan.uptrain import load_transformer_weights

            for part in self.model_parts:
                load_transformer_weights(part, source)

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        loss = super().forward_backward_step(
            input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
        )
        if self.job_config.reliability.nonfinite != "off":
            # Kept on the device and copied to the host right behind this backward (FlagToHost),
            # so the optimizer-step guard waits for the backward only, not for the optimizer work
            # queued after it. The norms are taken before clipping, which turns every gradient NaN
            # once one is.
            names, grads = zip(*self._named_grads())
            self._grad_norms = (names, torch.stack(torch._foreach_norm(list(grads))))
            bad = ~torch.isfinite(loss).all() | ~torch.isfinite(self._grad_norms[1]).all()
            self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
            self._flag_to_host.start(self._nonfinite)
        return loss

    def _named_grads(self):
        for part in self.model_parts:
            for name, param in part.named_parameters():
                if param.grad is not None:
                    grad = param.grad
                    yield name, grad.to_local() if hasattr(grad, "to_local") else grad

    def _finite_or_skip(self) -> bool:
        """Optimizer-step guard: False (skip the update) after a non-finite loss or gradient."""
        self._nonfinite = None
        if not self._any_rank(self._flag_to_host.get()):
            return True
        self.nonfinite_steps += 1
        names, norms = self._grad_norms
        bad = (~torch.isfinite(norms)).nonzero()
        first = names[int(bad[0])] if len(bad) else "none on this rank (non-finite loss)"
        policy = self.job_config.reliability.nonfinite
        logger.warning(
            f"non-finite loss or gradient at step {self.step}: first non-finite gradient (rank "
            f"{dist.get_rank() if dist.is_initialized() else 0}): {first}; reliability.nonfinite = {policy!r}: "
            + ("update skipped" if policy == "skip" else "update skipped, saving and stopping")
        )
        if policy == "stop":
            self._stop_reason = f"non-finite loss or gradient at step {self.step}"
        self.optimizers.zero_grad()
        return False

    def _on_sigterm(self, signum, frame) -> None:
        self._sigterm = True

    def train_step(self, data_iterator):
        super().train_step(data_iterator)
        self.metrics_processor.advance(self.step)
        self.diagnostics.maybe_run(
            self.step, self.model_parts, self.metrics_processor.logger.log, self._log_figure
        )
        if self.step == self.job_config.reliability.stop_at_step:
            self._stop_reason = f"reliability.stop_at_step = {self.step}"
        if self._any_rank(self._sigterm):
            self._stop_reason = "SIGTERM"

    def should_continue_training(self) -> bool:
        if self._stop_reason is None:
            return super().should_continue_training()
        save_checkpoint_now(self.checkpointer, self.step)
        logger.info(f"Stopping after step {self.step} ({self._stop_reason}); checkpoint saved, rerun to resume")
        return False

    def _any_rank(self, flag: bool) -> bool:
        """True if ``flag`` is set on any rank (signals reach ranks at slightly different times)."""
        if self._flag_group is None:
            return flag
        value = torch.tensor([float(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._flag_group)
        return bool(value.item())
