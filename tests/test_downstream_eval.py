"""[eval] every_n_steps: lm-eval tasks on the live model during training, sharded across ranks,
logged, and without any effect on training."""

from __future__ import annotations

import os
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from eval.downstream import DownstreamEvaluator, preserved_rng_states, scalar_metrics
from eval.lm_eval import evaluate
from eval.model import ParallaxLM
from parallax_titan.config import ConfigError, load_config
from tests._generation_models import tiny_model
from tests._train_runs import REPO, losses, metric_rows, train

CONFIG = os.path.join(REPO, "configs", "test_cpu_2rank.toml")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "lm_eval")
TASKS = "piqa,lambada_openai,wikitext"


def eval_args(every: int) -> list[str]:
    return ["--eval.every_n_steps", str(every), "--eval.tasks", TASKS, "--eval.data_dir", FIXTURES,
            "--eval.batch_size", "4"]


def test_every_n_steps_is_checked():
    config = load_config(["--job.config_file", CONFIG, *eval_args(3)], check_data=False)
    assert config.eval.every_n_steps == 3 and load_config(["--job.config_file", CONFIG], check_data=False).eval.every_n_steps == 0
    with pytest.raises(ConfigError, match="eval.every_n_steps: expected an integer >= 0"):
        load_config(["--job.config_file", CONFIG, "--eval.every_n_steps", "-1"], check_data=False)


def test_scalar_metrics_names():
    results = {"results": {"piqa": {"alias": "piqa", "acc,none": 0.5, "acc_stderr,none": "N/A", "acc_norm,none": 1},
                           "wikitext": {"word_perplexity,none": 12.5, "sample_len": 3}}}
    assert scalar_metrics(results) == {"eval/downstream/piqa/acc": 0.5, "eval/downstream/piqa/acc_norm": 1.0,
                                       "eval/downstream/wikitext/word_perplexity": 12.5}


def test_rng_states_are_restored():
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    with preserved_rng_states():
        torch.manual_seed(9), random.seed(9), np.random.seed(9), torch.rand(5)
    assert torch.equal(torch.rand(2), expected[0]) and (random.random(), np.random.rand()) == expected[1:]


def test_callback_scores_the_live_weights_like_the_adapter():
    """One process: the callback on a model equals ParallaxLM on the same weights; it runs on
    every N-th step only and logs at that step."""
    config = load_config(["--job.config_file", CONFIG, *eval_args(2)], check_data=False)
    evaluator = DownstreamEvaluator(config)
    model = tiny_model("parallax", max_seq_len=config.training.seq_len)
    logged = []
    trainer = SimpleNamespace(step=3, model_parts=[model],
                              metrics_processor=SimpleNamespace(logger=SimpleNamespace(log=lambda m, s: logged.append((s, m)))))
    evaluator(trainer)
    assert logged == [] and evaluator.replica is None  # not an evaluation step: nothing done
    trainer.step = 4
    evaluator(trainer)
    (step, metrics), = logged
    direct = evaluate(ParallaxLM(model, evaluator.tokenizer, batch_size=4), TASKS.split(","), data_dir=FIXTURES,
                      bootstrap_iters=0)
    assert step == 4 and metrics.pop("eval/downstream/seconds") > 0
    assert metrics == pytest.approx(scalar_metrics(direct), rel=1e-6)
    assert {"eval/downstream/piqa/acc", "eval/downstream/lambada_openai/perplexity",
            "eval/downstream/wikitext/word_perplexity"} <= set(metrics)


@pytest.mark.slow
def test_two_ranks_train_unchanged_and_log_the_sharded_scores(tmp_path):
    """torchrun, 2 CPU ranks (FSDP2): losses bit for bit those of the run without evaluation; the
    scores logged at steps 2 and 4 (metrics.jsonl, TensorBoard) are those of the step-2 / step-4
    checkpoints scored in one process."""
    common = ["--training.dataset", "default_corpus", "--training.steps", "4", "--checkpoint.interval", "2"]
    train(tmp_path / "off", *common, nproc=2)
    train(tmp_path / "on", *common, *eval_args(2), nproc=2)
    assert losses(tmp_path / "on") == losses(tmp_path / "off") and len(losses(tmp_path / "off")) == 4
    logged = {row["step"]: row for row in metric_rows(tmp_path / "on") if "eval/downstream/piqa/acc" in row}
    assert sorted(logged) == [2, 4]
    for step in (2, 4):
        lm = ParallaxLM.from_checkpoint(CONFIG, str(tmp_path / "on" / "checkpoint" / f"step-{step}"), device="cpu",
                                        batch_size=4)
        expected = scalar_metrics(evaluate(lm, TASKS.split(","), data_dir=FIXTURES, bootstrap_iters=0))
        assert {k: logged[step][k] for k in expected} == pytest.approx(expected, rel=1e-5)
    events = [os.path.join(root, f) for root, _, files in os.walk(tmp_path / "on") for f in files if "tfevents" in f]
    assert any(b"eval/downstream/piqa/acc" in open(path, "rb").read() for path in events)
