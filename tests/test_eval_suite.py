"""The ten-task paper suite, offline: lm-eval's real task configs on local fixture files, scored on
checkpoints written by the trainer (torchrun, 1 rank, with optimizer state)."""

import json
import math
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import eval.lm_eval as cli
from eval.at_end import run_at_end
from eval.model import ParallaxLM
from eval.table import COLUMNS
from eval.tasks import local_task_config, parse_tasks, task_config
from parallax_titan.config import ConfigError, Eval, JobConfig, load_config
from parallax_titan.config.schema import toml_problems
from parallax_titan.suite import PAPER_SUITE
from tests._train_runs import REPO, train

CONFIG = os.path.join(REPO, "configs", "test_cpu_2rank.toml")
# SPEC.md section 4: the table's columns, in the paper's order, as (header, task, lm-eval metric,
# accuracy?); LAMBADA reports perplexity and accuracy, WikiText word perplexity.
SPEC_COLUMNS = (
    ("LMB. ppl", "lambada_openai", "perplexity", False),
    ("Wiki ppl", "wikitext", "word_perplexity", False),
    ("LMB. acc", "lambada_openai", "acc", True),
    ("BoolQ", "boolq", "acc", True),
    ("HSwag", "hellaswag", "acc_norm", True),
    ("PIQA", "piqa", "acc", True),
    ("ARC-e", "arc_easy", "acc", True),
    ("ARC-c", "arc_challenge", "acc_norm", True),
    ("Wino.", "winogrande", "acc", True),
    ("OBQA", "openbookqa", "acc_norm", True),
    ("SciQ", "sciq", "acc", True),
)
FIXTURES = os.path.join(REPO, "tests", "fixtures", "lm_eval")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    dump = tmp_path_factory.mktemp("eval_run")
    train(dump, "--training.dataset", "default_corpus", "--training.steps", "2", "--checkpoint.interval", "1")
    return dump


def fixture_docs(task: str) -> int:
    with open(os.path.join(FIXTURES, f"{task}.jsonl")) as f:
        return sum(1 for line in f if line.strip())


def parse_table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]


def test_table_columns_are_spec_metrics():
    assert tuple(COLUMNS) == SPEC_COLUMNS
    assert PAPER_SUITE == ("lambada_openai", "wikitext", "boolq", "hellaswag", "piqa", "arc_easy",
                           "arc_challenge", "winogrande", "openbookqa", "sciq")


def test_checkpoint_loads_the_trained_weights(run_dir):
    checkpoint = str(run_dir / "checkpoint" / "step-2")
    lm = ParallaxLM.from_checkpoint(CONFIG, checkpoint, device="cpu")
    state = {k: torch.empty_like(v) for k, v in lm.model.state_dict().items()}
    dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
    for key, value in lm.model.state_dict().items():
        assert torch.equal(value, state[key]), key
    metadata = dcp.FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    assert any(k.startswith("optimizer.") for k in metadata)  # loaded despite the optimizer state


def test_ten_task_suite_writes_the_table(run_dir, tmp_path, capsys):
    checkpoints = [str(run_dir / "checkpoint" / f"step-{s}") for s in (1, 2)]
    rc = cli.main(["--config", CONFIG, "--checkpoint", *checkpoints, "--suite", "paper", "--output", str(tmp_path),
                   "--data-dir", FIXTURES, "--device", "cpu", "--batch-size", "8", "--bootstrap-iters", "0"])
    assert rc == 0
    table = (tmp_path / "results.md").read_text()
    assert table in capsys.readouterr().out
    header, rows = parse_table(table)
    assert header == ["Model", *(c[0] for c in SPEC_COLUMNS), "Avg."]
    names = [f"{run_dir.name}/step-1", f"{run_dir.name}/step-2"]
    assert [r[0] for r in rows] == names
    for name, row in zip(names, rows):
        results = json.loads((tmp_path / f"{name.replace('/', '_')}.json").read_text())
        assert set(results["results"]) == set(PAPER_SUITE)
        assert results["n-samples"] == {t: {"original": fixture_docs(t), "effective": fixture_docs(t)} for t in PAPER_SUITE}
        values = [float(v) for v in row[1:]]
        accs = []
        for (_, task, metric, is_acc), value in zip(SPEC_COLUMNS, values):
            raw = results["results"][task][f"{metric},none"]
            assert value == pytest.approx(100 * raw if is_acc else raw, abs=0.006)
            if is_acc:
                assert 0 <= value <= 100
                accs.append(100 * raw)
            else:
                assert 1 < value < math.inf
        assert values[-1] == pytest.approx(sum(accs) / 9, abs=0.006)
    assert rows[0][1:3] != rows[1][1:3]  # two different checkpoints, two different perplexities


def test_run_at_end_writes_under_dump_folder(run_dir, tmp_path):
    from eval.checkpoint import load_job_config

    job_config = load_job_config(CONFIG, ["--job.dump_folder", str(tmp_path)])
    job_config.eval = Eval(at_end=True, tasks=["wikitext", "boolq"], data_dir=FIXTURES, device="cpu", bootstrap_iters=0)
    path = run_at_end(job_config, str(run_dir / "checkpoint" / "step-2"))
    assert path == str(tmp_path / "eval" / "results.md")
    _, rows = parse_table(open(path).read())
    cells = dict(zip([c[0] for c in SPEC_COLUMNS] + ["Avg."], rows[0][1:]))
    assert cells["LMB. ppl"] == "-" and cells["HSwag"] == "-"
    assert float(cells["Wiki ppl"]) > 1 and cells["Avg."] == cells["BoolQ"] + "*"


def test_eval_section_is_part_of_the_job_config():
    assert toml_problems({"eval": {"at_end": True, "tasks": ["boolq"], "limit": 5}}, JobConfig) == []
    assert toml_problems({"eval": {"tasks": "boolq"}}, JobConfig) != []
    config = load_config(["--job.config_file", CONFIG, "--eval.tasks", "sciq,wikitext"], check_data=False)
    assert config.eval.tasks == ["sciq", "wikitext"] and config.eval.at_end is False
    assert load_config(["--job.config_file", CONFIG], check_data=False).eval.tasks == list(PAPER_SUITE)
    with pytest.raises(ConfigError, match="eval.tasks: unknown"):
        load_config(["--job.config_file", CONFIG, "--eval.tasks", "sciq,mmlu"], check_data=False)


def test_local_configs_keep_the_real_prompts_and_metrics():
    for task in PAPER_SUITE:
        real, local = task_config(task), local_task_config(task, FIXTURES)
        for key in ("doc_to_text", "doc_to_target", "doc_to_choice", "metric_list", "output_type", "process_docs"):
            assert local.get(key) == real.get(key), (task, key)
        assert local["dataset_path"] == "json"
        assert list(local["dataset_kwargs"]["data_files"]) == [real.get("test_split") or real["validation_split"]]


def test_cli_rejects_bad_arguments(run_dir, tmp_path, capsys):
    checkpoint = str(run_dir / "checkpoint" / "step-2")
    base = ["--config", CONFIG, "--output", str(tmp_path), "--data-dir", FIXTURES, "--device", "cpu"]
    assert cli.main([*base, "--checkpoint", checkpoint, "--tasks", "boolq,mmlu"]) == 2
    assert "tasks:" in capsys.readouterr().err
    assert cli.main([*base, "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "checkpoint:" in capsys.readouterr().err
    assert cli.main([*base, "--checkpoint", checkpoint, "--tasks", "boolq", "--data-dir", str(tmp_path)]) == 2
    assert "data_dir:" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tasks"):
        parse_tasks([])
    assert cli.lm_eval.simple_evaluate  # eval.lm_eval imports the harness, not itself


def test_prefetch_writes_files_the_suite_reads(tmp_path, monkeypatch):
    """eval.prefetch with the hub replaced by the fixtures: the JSONL it writes is what --data-dir reads."""
    import datasets

    from eval import prefetch

    real_load = datasets.load_dataset
    calls = []

    def fake_hub(path, name=None, **kwargs):
        task = {("allenai/ai2_arc", "ARC-Easy"): "arc_easy", ("aps/super_glue", "boolq"): "boolq"}[(path, name)]
        calls.append(task)
        split = prefetch.hub_source(task)["split"]
        return real_load("json", data_files={split: os.path.join(FIXTURES, f"{task}.jsonl")})

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    written = prefetch.prefetch(["arc_easy", "boolq"], str(tmp_path))
    assert calls == ["arc_easy", "boolq"] and len(written) == 2
    for task in ("arc_easy", "boolq"):
        with open(os.path.join(FIXTURES, f"{task}.jsonl")) as a, open(tmp_path / f"{task}.jsonl") as b:
            assert [json.loads(x) for x in a] == [json.loads(x) for x in b]
