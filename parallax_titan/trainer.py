"""The training loop: TorchTitan's Trainer with Parallax-Titan's additions.

The training step itself is TorchTitan's (``Trainer.train_step``): forward, loss, backward,
gradient clipping, optimizer and schedule steps. This subclass adapts the host, validates the
config before anything is built, runs the up-training conversion and drives the progress bar.
"""

from __future__ import annotations

from torchtitan.train import Trainer

from parallax_titan.compat import configure_for_host
from parallax_titan.validate import validate_job_config


class ParallaxTrainer(Trainer):
    def __init__(self, job_config):
        validate_job_config(job_config)
        configure_for_host(job_config)
        super().__init__(job_config)
        source = job_config.parallax.init_from_transformer
        if source:
            from parallax_titan.uptrain import load_transformer_weights

            for part in self.model_parts:
                load_transformer_weights(part, source)

    def train_step(self, data_iterator):
        super().train_step(data_iterator)
        self.metrics_processor.advance(self.step)
