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


class StepFlags:
    """Per-step flags (non-finite, SIGTERM) that every rank agrees on without a host barrier.

    ``start(flags)`` max-reduces the (2,) float tensor ``flags`` across ranks with a collective
    queued behind the backward (nothing on one rank) and queues its copy into pinned host memory,
    one buffer per step parity; ``read(lag)`` waits for that copy of this step (lag 0) or of the
    step before (lag 1) only, so work queued after it keeps running, and it never waits for another
    rank's host (a gloo all-reduce per step did: the ranks' hosts met there every step). CPU tensors
    are read directly. ``next_step()`` moves on; a step's flags are read at most once.
    """

    def __init__(self) -> None:
        self._step = 0
        self._slots: list = [None, None]  # per step parity: (host tensor, event or None)
        self._pinned: list = [None, None]
        self._multi = dist.is_initialized() and dist.get_world_size() > 1

    def start(self, flags: torch.Tensor) -> None:
        if self._multi:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        k = self._step % 2
        if not flags.is_cuda:
            self._slots[k] = (flags, None)
            return
        if self._pinned[k] is None:
            self._pinned[k] = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
        self._pinned[k].copy_(flags, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._slots[k] = (self._pinned[k], event)

    def read(self, lag: int = 0) -> tuple[bool, ...] | None:
        """The flags of this step (lag 0) or the previous one (lag 1) as bools, None if not started."""
        k = (self._step - lag) % 2
        if lag > self._step or self._slots[k] is None:
            return None
        host, event = self._slots[k]
        if event is not None:
            event.synchronize()
        self._slots[k] = None
        return tuple(bool(v) for v in host.tolist())

    def next_step(self) -> None:
        self._step += 1
        self._slots[self._step % 2] = None  # two steps old: unread flags are dropped, the buffer reused


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
        self._flags = StepFlags()
        self._agreed_sigterm = False  # SIGTERM as every rank saw it in the flags read this step
        if reliability.nonfinite != "off":
            self.optimizers.step_guard = self._finite_or_skip
        if reliability.save_on_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.diagnostics = DiagnosticsRunner.from_config(job_config, self.tokenizer)
        self._log_figure = tensorboard_figure_logger(self.metrics_processor.logger)
        source = job_config.parallax.init_from_transformer
        if source:
            from parallax_titan.uptrain import load_transformer_weights

            for part in self.model_parts:
                load_transformer_weights(part, source)

    def post_dataloading_process(self, input_dict, labels):
        """TorchTitan's batch preparation, plus document boundaries when the model asks for them
        (TorchTitan builds masks only for its own flex and varlen attention)."""
        inputs, labels, extra_inputs, extra_kwargs = super().post_dataloading_process(input_dict, labels)
        if self.model_args.needs_document_masks:
            extra_kwargs["attention_masks"] = self.model_parts[0].get_attention_masks(inputs, self.tokenizer)
        return inputs, labels, extra_inputs, extra_kwargs

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        loss = super().forward_backward_step(
            input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
        )
        if self.job_config.reliability.nonfinite != "off":
            # Kept on the device and copied to the host right behind this backward (StepFlags),
            # so the optimizer-step guard waits for the backward only, not for the optimizer work
            # queued after it. The norms are taken before clipping, which turns every gradient NaN
            # once one is.
            names, grads = zip(*self._named_grads())
            self._grad_norms = (names, torch.stack(torch._foreach_norm(list(grads))))
            bad = ~torch.isfinite(loss).all() | ~torch.isfinite(self._grad_norms[1]).all()
            self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        nonfinite = self._nonfinite if self._nonfinite is not None else torch.zeros((), device=loss.device)
        # a fill kernel, not a host-to-device copy (that would synchronise the stream)
        sigterm = torch.full((), float(self._sigterm), device=loss.device)
        self._flags.start(torch.stack([nonfinite.float(), sigterm]))
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
        nonfinite, self._agreed_sigterm = self._flags.read()
        if not nonfinite:
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
        if self._sigterm_on_every_rank():
            self._stop_reason = "SIGTERM"
        self._flags.next_step()

    def _sigterm_on_every_rank(self) -> bool:
        """SIGTERM as all ranks agree on it: from this step's flags when the guard read them, else
        from the previous step's (read without waiting for this step's work: one step later)."""
        if self.job_config.reliability.nonfinite != "off":
            return self._agreed_sigterm
        flags = self._flags.read(lag=1)
        return flags is not None and flags[1]

    def should_continue_training(self) -> bool:
        if self._stop_reason is None:
            return super().should_continue_training()
        save_checkpoint_now(self.checkpointer, self.step)
        logger.info(f"Stopping after step {self.step} ({self._stop_reason}); checkpoint saved, rerun to resume")
        return False
