"""End to end through torchrun on CPU: with ``dataset = "pretokenized"`` 1 rank and 2 ranks train on
the same sequences step by step, and a run stopped on 2 ranks continues on 1 exactly; the text
global order also resumes on another number of ranks; the sharded order refuses to, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from parallax_titan.data import pretokenize as pt
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH
from tests._train_runs import REPO, TEST_CONFIG, losses, metric_rows, train
from tests.test_pretokenize import corpus_docs, write_jsonl

COMMON = ("--training.seq_len", "32", "--checkpoint.interval", "100", "--training.global_batch_size", "4")


@pytest.fixture(scope="module")
def seed_start(tmp_path_factory):
    seed = tmp_path_factory.mktemp("seed")
    train(seed, "--training.dataset", "default_corpus", "--checkpoint.create_seed_checkpoint")
    return ("--checkpoint.initial_load_path", os.path.join(seed, "checkpoint", "step-0"))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("pretokenized")
    spec = pt.SourceSpec("local", write_jsonl(base / "docs.jsonl", corpus_docs(120)))
    pt.pretokenize(spec, str(base / "out"), TINY_TOKENIZER_PATH, pt.Options(validation_fraction=0.2, docs_per_shard=40),
                   progress=False)
    return str(base / "out")


@pytest.mark.slow
def test_pretokenized_same_sequences_on_one_and_two_ranks_and_resume_from_two_on_one(tmp_path, shards, seed_start):
    args = ("--training.dataset", "pretokenized", "--training.dataset_path", shards, "--training.steps", "4",
            "--parallax.attn_mask_type", "block_causal", "--validation.enable", "--validation.dataset", "pretokenized",
            "--validation.dataset_path", shards, "--validation.seq_len", "32", "--validation.local_batch_size", "2",
            "--validation.freq", "2", "--validation.steps", "2", *COMMON, *seed_start)
    train(tmp_path / "one", *args, "--training.local_batch_size", "4")
    train(tmp_path / "two", *args, "--training.local_batch_size", "2", nproc=2)
    # the moved run reads ahead on a thread (the paper configs' loader keys): same batches, same position
    ahead = ("--training.dataloader.num_workers", "1", "--training.dataloader.prefetch_factor", "3",
             "--validation.dataloader.num_workers", "1")
    train(tmp_path / "moved", *args, *ahead, "--training.local_batch_size", "2", "--reliability.stop_at_step", "2",
          nproc=2)
    result = train(tmp_path / "moved", *args, *ahead, "--training.local_batch_size", "4")
    assert "Training starts at step 3" in result.stdout + result.stderr
    one, two, moved = (losses(tmp_path / name) for name in ("one", "two", "moved"))
    assert sorted(one) == sorted(two) == sorted(moved) == [1, 2, 3, 4]
    assert two == pytest.approx(one, rel=1e-5, abs=0), (one, two)
    assert moved == pytest.approx(one, rel=1e-5, abs=0), (one, moved)
    shares = [r for r in metric_rows(tmp_path / "one") if "data/out/fraction" in r]
    assert shares and all(r["data/out/fraction"] == 1.0 for r in shares)
    validated = [r for r in metric_rows(tmp_path / "two") if "validation_metrics/loss" in r]
    assert [r["step"] for r in validated] == [1, 2, 4]


@pytest.mark.slow
def test_text_global_order_resumes_on_another_number_of_ranks(tmp_path, seed_start):
    args = ("--training.dataset", "default_corpus", "--training.data_order", "global", "--training.steps", "3",
            *COMMON, *seed_start)
    train(tmp_path / "one", *args, "--training.local_batch_size", "4")
    train(tmp_path / "moved", *args, "--training.local_batch_size", "4", "--reliability.stop_at_step", "1")
    train(tmp_path / "moved", *args, "--training.local_batch_size", "2", nproc=2)
    assert losses(tmp_path / "moved") == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=0)


@pytest.mark.slow
def test_sharded_order_refuses_another_number_of_ranks(tmp_path):
    """Same local and global batch (1 rank accumulating 2 microbatches, then 2 ranks): the resume
    rules accept the settings, and the sharded data position refuses the new rank count."""
    args = ("--training.dataset", "default_corpus", "--training.steps", "3", "--training.local_batch_size", "2",
            "--training.global_batch_size", "4", *COMMON)
    train(tmp_path, *args, "--reliability.stop_at_step", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", "--job.config_file",
           TEST_CONFIG, "--job.dump_folder", str(tmp_path), *args]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0
    assert ("the checkpoint holds the data positions of 1 data-parallel ranks in training.data_order = 'sharded'"
            in result.stdout + result.stderr)
    assert sorted(losses(tmp_path)) == [1]  # nothing trained


@pytest.mark.slow
def test_documented_second_path_pretokenize_the_embedded_corpus_and_train_from_shards(tmp_path):
    """docs/data.md's second path: the pre-tokenizer's command line on the embedded corpus, then the
    CPU demo config trained from the shards (training and validation)."""
    shards = tmp_path / "embedded_tiny"
    cli = subprocess.run([sys.executable, "-m", "scripts.pretokenize", "--source", "embedded", "--tokenizer",
                          TINY_TOKENIZER_PATH, "--out", str(shards), "--docs-per-shard", "500", "--no-progress"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    train(tmp_path / "run", "--training.dataset", "pretokenized", "--training.dataset_path", str(shards),
          "--validation.dataset", "pretokenized", "--validation.dataset_path", str(shards),
          "--diagnostics.dataset", "default_corpus_validation", "--diagnostics.freq", "2", "--training.steps", "2",
          "--validation.freq", "2",
          "--validation.steps", "1", "--metrics.log_freq", "1", config="configs/demo_cpu.toml")
    rows = metric_rows(tmp_path / "run")
    assert sorted(losses(tmp_path / "run")) == [1, 2]
    assert any("validation_metrics/loss" in r for r in rows)
    assert any(r.get("data/embedded_tiny/fraction") == 1.0 for r in rows)
    assert any(any(k.startswith("diag/") for k in r) for r in rows)  # the held-out batch from the text corpus
