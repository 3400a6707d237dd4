"""The diagnostics pass on small models: hooks read what the forward computes, results match
direct computations, training is bit-identical with and without it, and TensorBoard gets it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from kernels.parallax.naive import parallax_attention_naive
from parallax_titan.config import load_config
from parallax_titan.diagnostics import Diagnostics, DiagnosticsRunner, collect, tensorboard_figure_logger
from parallax_titan.diagnostics.attention import attention_weights, causal_document_mask, layer_statistics
from parallax_titan.diagnostics.capture import attention_hooks, project_qrkv
from parallax_titan.diagnostics.spectral import singular_values, spectral_metrics
from parallax_titan.diagnostics.weights import attention_modules
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer

SEQ = 32
CONFIG = Diagnostics(enable=True, freq=2, max_queries=8, cka_tokens=64)


def tiny(variant: str, seed: int = 0, dtype=torch.float32, **overrides) -> ParallaxQwen3Model:
    base = dataclasses.replace(BASE_FLAVORS["debug"], dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                               hidden_dim=96, vocab_size=4096, max_seq_len=SEQ)
    torch.manual_seed(seed)
    model = ParallaxQwen3Model(dataclasses.replace(variant_args(variant, base), **overrides))
    with torch.no_grad():
        model.init_weights()
    return model.to(dtype)


@pytest.fixture(scope="module")
def tokenizer():
    return PretrainTokenizer(TINY_TOKENIZER_PATH)


def batch(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 4096, (2, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", ["parallax", "transformer"])
def test_hooks_capture_what_the_forward_uses(variant):
    """Module output == wo(attention(q, r, k, v)) with the q, r, k, v the hook recomputed."""
    model = tiny(variant, dtype=torch.float64)
    seen = {}

    def on_layer(layer, module, x, rope_cache, positions):
        seen[layer] = (module, x, project_qrkv(module, x, rope_cache, positions))

    outputs = {}
    handles = [m.register_forward_hook(lambda mod, a, out, i=i: outputs.__setitem__(i, out))
               for i, _, m in attention_modules(model)]
    with torch.no_grad(), attention_hooks(model, on_layer):
        model(batch())
    for h in handles:
        h.remove()
    assert sorted(seen) == [0, 1]
    for layer, (module, x, (q, r, k, v)) in seen.items():
        if variant == "parallax":
            attn = parallax_attention_naive(q, r, k, v)
        else:
            rep = q.shape[2] // k.shape[2]
            attn = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1),
                                                v.transpose(1, 2).repeat_interleave(rep, 1), is_causal=True).transpose(1, 2)
        torch.testing.assert_close(module.wo(attn.reshape(*x.shape[:2], -1)), outputs[layer])
    assert all(not m._forward_pre_hooks for _, _, m in attention_modules(model))


def test_collect_matches_direct_computation(tokenizer):
    model = tiny("parallax", gate="head", dtype=torch.float64)
    tokens = batch()
    tokens[0, 10] = tokenizer.eos_id
    result = collect(model, tokens, tokenizer, CONFIG)
    # Recompute layer inputs by hand: embeddings, then each block's pre-norm.
    h = model.tok_embeddings(tokens)
    mask = causal_document_mask(tokens, None)  # the debug flavor uses causal masks
    with torch.no_grad():
        for i, block in model.layers.items():
            x = block.attention_norm(h)
            q, r, k, v = block.attention.project(x, model.rope_cache, None)
            expected = layer_statistics(q, r, k, v, mask, max_queries=CONFIG.max_queries, ridge=CONFIG.corr_ridge)
            got = result.attention[int(i)]
            for name, value in expected.items():
                assert got[name] == pytest.approx(value, rel=1e-9, nan_ok=True), name
            assert got["gate"] == pytest.approx(float(torch.sigmoid(block.attention.gate(x)).mean()))
            h = block(h, model.rope_cache, None)
            # Per-head circuit W_QK of head 3 (kv head 1), from the explicit d x d product.
            wq = block.attention.wq.weight[3 * 16:4 * 16].double()
            wk = block.attention.wk.weight[16:32].double()
            s = singular_values(wq.T @ wk)[:16]
            heads = [spectral_metrics(singular_values(block.attention.wq.weight[j * 16:(j + 1) * 16].T.double()
                                                      @ block.attention.wk.weight[(j // 2) * 16:(j // 2 + 1) * 16].double())[:16])
                     ["stable_rank"] for j in range(4)]
            assert result.spectral[int(i)]["W_QK"]["stable_rank"] == pytest.approx(float(torch.stack(heads).mean()), rel=1e-9)
            assert float(spectral_metrics(s)["stable_rank"]) == pytest.approx(float(heads[3]))
            full = spectral_metrics(singular_values(block.attention.wr.weight))
            assert result.spectral[int(i)]["W_R"]["erank"] == pytest.approx(float(full["erank"]), rel=1e-12)
    scalars = result.scalars()
    for tag in ("diag/layer_00/cor", "diag/layer_01/cpa", "diag/layer_01/gate", "diag/mean/W_RK/stable_rank",
                "diag/layer_00/cka/v_fixed", "diag/cost/total_s", "diag/mean/sink_w"):
        assert tag in scalars, tag
    assert scalars["diag/mean/cor"] == pytest.approx((result.attention[0]["cor"] + result.attention[1]["cor"]) / 2)



def test_collect_reads_the_sliding_window_the_forward_uses(tokenizer):
    """With parallax.window = W the statistics were those of full causal attention (entropy above
    log W, which W readable keys cannot reach): the diagnostics mask ignored the window."""
    window = 4
    model = tiny("parallax", window=window, dtype=torch.float64)
    tokens = batch()
    i, j = torch.arange(SEQ)[:, None], torch.arange(SEQ)[None, :]
    mask = ((j <= i) & (j > i - window)).expand(2, SEQ, SEQ)  # SPEC 1b: i - W < j <= i
    seen, outputs = {}, {}
    handles = [m.register_forward_hook(lambda mod, a, out, n=n: outputs.__setitem__(n, out))
               for n, _, m in attention_modules(model)]
    with torch.no_grad(), attention_hooks(model, lambda n, m, x, rope, pos: seen.__setitem__(
            n, (m, project_qrkv(m, x, rope, pos)))):
        model(tokens)
    for h in handles:
        h.remove()
    result = collect(model, tokens, tokenizer, CONFIG, spectral=False)
    for layer, (module, (q, r, k, v)) in seen.items():
        # the reference mask is the forward's: sum_j w_ij v_j under it reproduces the module's output
        kh, vh = (t.transpose(1, 2).repeat_interleave(2, 1) for t in (k, v))
        p, spread = attention_weights(q.transpose(1, 2), r.transpose(1, 2), kh, mask[:, None], module.scaling)
        attn = ((p - spread) @ vh).transpose(1, 2).reshape(2, SEQ, -1)
        torch.testing.assert_close(module.wo(attn), outputs[layer])
        expected = layer_statistics(q, r, k, v, mask, scale=module.scaling, max_queries=CONFIG.max_queries,
                                    ridge=CONFIG.corr_ridge)
        for name, value in expected.items():
            assert result.attention[layer][name] == pytest.approx(value, rel=1e-9, nan_ok=True), name
        assert result.attention[layer]["entropy"] <= math.log(window)

def train_steps(model, runner=None, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    logged = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        logits = model(batch(seed=step))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch(seed=step).roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        if runner is not None:
            runner.maybe_run(step, [model], lambda d, s: logged.append((s, d)))
    return loss.detach(), logged


@pytest.mark.parametrize("enable", [True, False])
def test_training_is_bit_identical_with_diagnostics(tokenizer, enable):
    plain_loss, _ = train_steps(tiny("parallax", gate="token"))
    runner = DiagnosticsRunner(dataclasses.replace(CONFIG, enable=enable), batch(seed=9), tokenizer)
    model = tiny("parallax", gate="token")
    rng = torch.get_rng_state()
    loss, logged = train_steps(model, runner)
    assert torch.equal(loss, plain_loss)
    reference = tiny("parallax", gate="token")
    train_steps(reference)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert [s for s, _ in logged] == ([2] if enable else [])
    if enable:
        assert "diag/layer_01/cor" in logged[0][1]
    assert torch.equal(torch.get_rng_state(), rng) or not enable  # the pass draws no random numbers
    assert all(not m._forward_pre_hooks for _, _, m in attention_modules(model))


def test_runner_from_config_and_tensorboard(tmp_path, tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torchtitan.components.metrics import LoggerContainer, TensorBoardLogger

    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml"], check_data=False)
    job.diagnostics = Diagnostics(enable=True, freq=5, batch_size=2, seq_len=SEQ, max_queries=4, cka_tokens=32)
    runner = DiagnosticsRunner.from_config(job, tokenizer)
    again = DiagnosticsRunner.from_config(job, tokenizer)
    assert runner.tokens.shape == (2, SEQ) and torch.equal(runner.tokens, again.tokens)
    metric_logger = LoggerContainer()
    metric_logger.add_logger(TensorBoardLogger(str(tmp_path)))
    model = tiny("parallax")
    log_figure = tensorboard_figure_logger(metric_logger)
    assert runner.maybe_run(4, [model], metric_logger.log, log_figure) is None
    scalars = runner.maybe_run(5, [model], metric_logger.log, log_figure)
    metric_logger.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    assert "diag/layer_01/cor" in events.Tags()["scalars"] and "diag/layer_01/cor" in scalars
    assert events.Scalars("diag/layer_01/cor")[0].step == 5
    assert {"diag/depth/cor", "diag/depth/stable_rank"} <= set(events.Tags()["images"])
    assert tensorboard_figure_logger(LoggerContainer()) is None


@pytest.mark.parametrize("key,value", [("freq", 0), ("seq_len", 10_000), ("spectral_freq", 3), ("cka_tokens", 1),
                                       ("corr_ridge", float("inf")),  # inf: every Corr was the ridge's, not the data's
                                       ("seq_len", 1)])  # 1: no query reads two keys, CPA and Corr were never logged
def test_bad_config_is_rejected(key, value):
    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml"], check_data=False)
    job.diagnostics = dataclasses.replace(Diagnostics(enable=True, freq=2), **{key: value})
    assert any(p.startswith(f"diagnostics.{key}: expected") and p.endswith(f"got {value}") for p in job.validate())


def test_the_held_out_batch_is_read_under_the_jobs_bad_data_policy(tmp_path, tokenizer):
    """The config check read a local held-out file under reliability.bad_data and
    training.max_record_bytes, the runner under the defaults: a file with a bad line the config took
    stopped the run when its batch was read (after the model was built)."""
    texts = [f"document {i} " + "word " * 5 for i in range(12)]
    path = tmp_path / "heldout.jsonl"
    lines = [f'{{"content": "{t}"}}\n' for t in texts]
    path.write_text(lines[0] + '{"content": 5}\n' + "".join(lines[1:]))  # the config check reads line 1
    args = ["--job.config_file", "configs/test_cpu_2rank.toml", "--diagnostics.enable", "--diagnostics.dataset",
            "local", "--diagnostics.dataset_path", str(path), "--diagnostics.batch_size", "2",
            "--diagnostics.seq_len", "16", "--diagnostics.freq", "1"]
    job = load_config([*args, "--reliability.bad_data", "skip"], check_data=False)
    expected = [t for text in texts for t in tokenizer.encode(text, add_bos=True, add_eos=True)][:32]
    assert DiagnosticsRunner.from_config(job, tokenizer).tokens.flatten().tolist() == expected
    job = load_config(args, check_data=False)
    with pytest.raises(ValueError, match=r"heldout\.jsonl, line 2: 'content' is 5"):
        DiagnosticsRunner.from_config(job, tokenizer)


def test_missing_dataset_is_rejected(tokenizer):
    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml"], check_data=False)
    job.diagnostics = Diagnostics(enable=True, dataset="nope")
    with pytest.raises(ValueError, match="diagnostics.dataset = 'nope'"):
        DiagnosticsRunner.from_config(job, tokenizer)


def test_dataset_path_without_dataset_is_refused():
    """diagnostics.dataset_path was ignored without a word when diagnostics.dataset was empty: the
    held-out batch came from the validation data or the embedded corpus instead."""
    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml"], check_data=False)
    job.diagnostics = Diagnostics(enable=True, dataset_path="/data/heldout.jsonl")
    assert any(p.startswith("diagnostics.dataset_path: '/data/heldout.jsonl' is set but diagnostics.dataset is empty")
               for p in job.validate(check_data=False))


@pytest.mark.parametrize("dataset, path", [("local", "/nonexistent"), ("local", ""),
                                           ("default_corpus", "/nonexistent.jsonl")])
def test_unreadable_dataset_path_is_refused_by_the_config_check(tmp_path, dataset, path):
    """A diagnostics.dataset_path that cannot be read passed the config check and failed when the
    trainer built the held-out batch, after the model, naming training.dataset_path."""
    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml"], check_data=False)
    job.diagnostics = Diagnostics(enable=True, dataset=dataset, dataset_path=path)
    problems = [p for p in job.validate(check_data=False) if "dataset_path" in p]
    assert problems and all(p.startswith("diagnostics.dataset_path") for p in problems), problems


def test_a_heldout_batch_the_dataset_cannot_fill_is_a_config_error(tokenizer):
    """batch_size x seq_len beyond the held-out dataset's tokens stopped the trainer with a ValueError
    traceback (exit code 1) once the model was built; a config error is reported by train.py with
    exit code 2, the keys and the values."""
    from parallax_titan.config import ConfigError

    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml"], check_data=False)
    job.diagnostics = Diagnostics(enable=True, freq=2, batch_size=100_000, seq_len=SEQ)
    with pytest.raises(ConfigError, match=rf"has only \d+ tokens; the held-out batch needs diagnostics.batch_size "
                                          rf"\* seq_len = 100000 \* {SEQ} = {100_000 * SEQ}; expected at most \d+"):
        DiagnosticsRunner.from_config(job, tokenizer)


def test_a_heldout_batch_the_dataset_cannot_fill_stops_the_trainer_before_the_build(tmp_path, monkeypatch):
    """The runner's ConfigError came from the trainer after TorchTitan had built the model (and set up
    the process group, the data loader, the optimizer): minutes of a large model's build for a config error."""
    import torchtitan.train

    from parallax_titan.config import ConfigError
    from parallax_titan.trainer import ParallaxTrainer

    def build(trainer, job_config):
        raise AssertionError("TorchTitan's build (the model's included) ran before the held-out batch was checked")

    monkeypatch.setattr(torchtitan.train.Trainer, "__init__", build)
    job = load_config(["--job.config_file", "configs/test_cpu_2rank.toml", "--job.dump_folder", str(tmp_path),
                       "--training.dataset", "default_corpus", "--diagnostics.enable", "--diagnostics.freq", "2",
                       "--diagnostics.batch_size", "100000", "--diagnostics.seq_len", str(SEQ)])
    with pytest.raises(ConfigError, match=rf"the held-out batch needs diagnostics.batch_size \* seq_len = 100000 \* "
                                          rf"{SEQ} = {100_000 * SEQ}"):
        ParallaxTrainer(job)
