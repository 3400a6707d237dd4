"""The training loop: TorchTitan's Trainer with Parallax-Titan's additions.

The training step itself is TorchTitan's (``Trainer.train_step``): forward, loss, backward,
gradient clipping, optimizer and schedule steps. This subclass adapts the host, refuses a
checkpoint of another model (or a data position its loader cannot continue) and a diagnostics batch
its dataset cannot fill before anything is built, runs the up-training conversion, drives the
progress bar and diagnostics, and handles interruptions (SIGTERM, ``reliability.stop_at_step``) and
non-finite steps (``reliability.nonfinite``; the skip itself is decided by the optimizers
container) by saving a full checkpoint and leaving the loop, so that rerunning the command resumes
exactly (with ``checkpoint.enable = false`` it leaves the loop and says that nothing was saved). Checkpoints go through :class:`parallax_titan.checkpointing.ParallaxCheckpointManager`
(atomic saves, checksums); after a resume, settings changed since the checkpoint follow
:mod:`parallax_titan.resume_rules`. It expects a config from
:func:`parallax_titan.config.load_config` (validated there). ``step_callbacks`` are called as
``callback(trainer)`` after every step (the entry point injects them, e.g. downstream evaluation
from ``eval/``, which this package may not import).
"""

from __future__ import annotations

import functools
import os
import signal
import threading

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from parallax_titan.checkpoint_files import step_dir
from parallax_titan.checkpointing import ParallaxCheckpointManager
from parallax_titan.compat import configure_for_host, save_checkpoint_now, trainer_checkpoint_manager
from parallax_titan.config import ConfigError, JobConfig
from parallax_titan.data import DOCUMENT_STARTS, document_boundaries_from_starts
from parallax_titan.diagnostics.runner import DiagnosticsRunner, tensorboard_figure_logger
from parallax_titan.resume import checkpoint_plan, resume_step_problems
from parallax_titan.resume_rules import (applied, configured_hyperparameters, differences, loads_data_position,
                                         reapply, run_settings)
from parallax_titan.step_flags import StepFlags
from parallax_titan.tokenizer import build_tokenizer


class NonFiniteStop(RuntimeError):
    """``reliability.nonfinite = "stop"`` ended the run; the message names the step and its checkpoint,
    or says that none was written (``checkpoint.enable = false``)."""


def dump_folder_problems(folder: str) -> list[str]:
    """``job.dump_folder`` must be a folder this process can create and write a file in."""
    probe = os.path.join(folder, f".write_check.{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"0")
        os.remove(probe)
    except OSError as exc:
        return [f"job.dump_folder: {folder!r} is not writable ({type(exc).__name__}: {exc}); checkpoints, metrics "
                "and logs are written there"]
    return []


NO_CHECKPOINT = "no checkpoint written because checkpoint.enable = false (a rerun starts over)"
"""What a stop says instead of naming its checkpoint when checkpoints are off (SIGTERM and
``reliability.nonfinite = "stop"`` are allowed then: ``save_on_sigterm`` is on by default)."""


def rerun_hint(load_step: int) -> str:
    """What a stop that saved its checkpoint tells the user: rerun to resume, without
    ``checkpoint.load_step`` where it is set (``load_step``; -1: unset), since a rerun with that key
    loads that step again, not the one just saved."""
    if load_step < 0:
        return "checkpoint saved, rerun to resume"
    return (f"checkpoint saved; rerun without checkpoint.load_step = {load_step} to resume from it (with that key "
            f"a rerun loads step-{load_step} again)")


def save_for_stop(checkpointer, step: int) -> bool:
    """Save the full checkpoint of ``step`` before a stop; whether there is one (False with
    ``checkpoint.enable = false``, where nothing is written)."""
    if not checkpointer.enable:
        return False
    save_checkpoint_now(checkpointer, step)
    return True


def diagnostics_runner(job_config: JobConfig) -> DiagnosticsRunner:
    """The ``[diagnostics]`` runner with its held-out batch, built before the model: a batch its
    dataset cannot fill is a ConfigError before TorchTitan's build. With diagnostics on it tokenizes
    with a tokenizer of its own (TorchTitan's is built inside that build)."""
    tokenizer = build_tokenizer(job_config) if job_config.diagnostics.enable else None
    return DiagnosticsRunner.from_config(job_config, tokenizer)


class ParallaxTrainer(Trainer):
    def __init__(self, job_config: JobConfig, step_callbacks=()):
        plan = checkpoint_plan(job_config)
        problems = plan.problems + dump_folder_problems(job_config.job.dump_folder)
        if problems:
            raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
        self.diagnostics = diagnostics_runner(job_config)
        configure_for_host(job_config)
        with trainer_checkpoint_manager(ParallaxCheckpointManager):
            super().__init__(job_config)
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.checkpointer.settings = run_settings(job_config, world)
        self.checkpointer.check_step = functools.partial(self._check_resume_step, plan.resume_step)
        self.checkpointer.on_loaded = self._apply_resume_rules
        self._configured = configured_hyperparameters(self.optimizers)  # before a load overwrites them
        reliability = job_config.reliability
        self.optimizers.skip_nonfinite = reliability.nonfinite != "off"
        self.nonfinite_steps = 0
        self._stop_reason: str | None = None
        self._nonfinite_stop: str | None = None
        self._sigterm = False
        self._sigterm_flags = StepFlags()
        self._microbatch = 0
        if reliability.save_on_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
            signal.signal(signal.SIGUSR1, self._on_sigterm)  # Slurm's warning ahead of the time limit
        self.step_callbacks = list(step_callbacks)
        self._log_figure = tensorboard_figure_logger(self.metrics_processor.logger)
        source = job_config.parallax.init_from_transformer
        if plan.loads_transformer:
            from parallax_titan.uptrain import load_transformer_weights

            for index, part in enumerate(self.model_parts):  # one check (every rank, shared) covers all parts
                load_transformer_weights(part, source, verify=job_config.checkpoint.verify and index == 0)
        elif source:
            logger.info(f"parallax.init_from_transformer = {source!r} is not loaded: the run resumes step "
                        f"{plan.resume_step} of its own checkpoint folder, whose weights replace it")

    def post_dataloading_process(self, input_dict, labels):
        """TorchTitan's batch preparation, plus document boundaries when the model asks for them
        (TorchTitan builds masks only for its own flex and varlen attention); pre-tokenized batches
        bring them from the shards' document index."""
        starts = input_dict.pop(DOCUMENT_STARTS, None)
        inputs, labels, extra_inputs, extra_kwargs = super().post_dataloading_process(input_dict, labels)
        if self.model_args.needs_document_masks:
            extra_kwargs["attention_masks"] = (
                document_boundaries_from_starts(starts) if starts is not None
                else self.model_parts[0].get_attention_masks(inputs, self.tokenizer))
        return inputs, labels, extra_inputs, extra_kwargs

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        loss = super().forward_backward_step(
            input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
        )
        self.optimizers.observe_backward(loss)
        self._microbatch += 1
        if self._microbatch == self.gradient_accumulation_steps:
            # queued right behind the last backward, read after the optimizer step was issued
            self._microbatch = 0
            self._sigterm_flags.agree(torch.full((), float(self._sigterm), device=loss.device))
        return loss

    def _on_sigterm(self, signum, frame) -> None:
        self._sigterm = True

    def train_step(self, data_iterator):
        super().train_step(data_iterator)
        if self.optimizers.last_step_skipped():
            self._report_nonfinite()
        self.metrics_processor.advance(self.step)
        mixture = getattr(self.dataloader, "mixture_metrics", None)  # pre-tokenized sources' realised shares
        if mixture is not None and self.metrics_processor.should_log(self.step):
            self.metrics_processor.logger.log(mixture(self.step), self.step)
        self.diagnostics.maybe_run(
            self.step, self.model_parts, self.metrics_processor.logger.log, self._log_figure
        )
        for callback in self.step_callbacks:
            callback(self)
        if self.step == self.job_config.reliability.stop_at_step:
            self._stop_reason = f"reliability.stop_at_step = {self.step}"
        if bool(self._sigterm_flags.read()):
            self._stop_reason = "SIGTERM"

    def _report_nonfinite(self) -> None:
        self.nonfinite_steps += 1
        policy = self.job_config.reliability.nonfinite
        logger.warning(
            f"non-finite loss or gradient at step {self.step}: first non-finite gradient (rank "
            f"{dist.get_rank() if dist.is_initialized() else 0}): {self.optimizers.first_nonfinite_gradient()}; "
            f"reliability.nonfinite = {policy!r}: "
            + ("update skipped" if policy == "skip" else
               "update skipped, saving and stopping" if self.checkpointer.enable else "update skipped, stopping")
        )
        if policy == "stop":
            self._stop_reason = self._nonfinite_stop = f"non-finite loss or gradient at step {self.step}"

    def _check_resume_step(self, planned: int | None, step: int) -> None:
        """Before the load of ``step``: a step other than the one checked before the build
        (``planned``; the load passed over a newer one whose tensor files fail their checksums) gets
        the same checks, so a fallback never loads what the config's check would refuse."""
        if step == planned:
            return
        problems = resume_step_problems(self.job_config, step)
        if problems:
            raise ConfigError("invalid config:\n  " + "\n  ".join(problems))

    def _apply_resume_rules(self, step: int, saved: dict | None) -> None:
        """After a load of ``step`` (checked before it: :meth:`_check_resume_step`): apply the
        config's settings the resume rules allow to change, logged. Step 0 (a seed checkpoint) brings
        back model weights only: nothing to compare or re-apply."""
        if step == 0:
            return
        path, current = step_dir(self.checkpointer.folder, step), self.checkpointer.settings
        position_loaded = loads_data_position(self.job_config)
        before = self.lr_schedulers.schedulers[0].get_last_lr()[0]
        reapply(self.optimizers, self.lr_schedulers, self._configured)
        after = self.lr_schedulers.schedulers[0].get_last_lr()[0]
        if saved is None:
            logger.warning(f"{path!r} has no settings.json, so changes since it cannot be listed; the config's "
                           "optimizer and schedule settings apply from here")
        for line in applied([] if saved is None else differences(saved, current), step, current, position_loaded):
            logger.info(f"Resume: {line}")
        if after != before:
            logger.info(f"Resume: lr of step {step + 1}: {before:.6g} -> {after:.6g} (first parameter group)")

    def should_continue_training(self) -> bool:
        if self._stop_reason is None:
            return super().should_continue_training()
        saved = save_for_stop(self.checkpointer, self.step)
        if self._nonfinite_stop:
            raise NonFiniteStop(f"{self._nonfinite_stop} (reliability.nonfinite = 'stop'); "
                                + (f"checkpoint step-{self.step} saved" if saved else NO_CHECKPOINT))
        logger.info(f"Stopping after step {self.step} ({self._stop_reason}); "
                    + (rerun_hint(self.job_config.checkpoint.load_step) if saved else NO_CHECKPOINT))
        return False

