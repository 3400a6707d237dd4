"""Export a checkpoint to Hugging Face format, or import Hugging Face Qwen3 weights for training.

    # DCP checkpoint -> <out>/model.safetensors + config.json + tokenizer (+ the modeling code of a
    # Parallax model: AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True) loads it)
    python -m scripts.export_hf export --config X.toml --checkpoint OUT/checkpoint/step-N --output hf_out [--no-verify]

    # Hugging Face Qwen3 (e.g. a local copy of Qwen/Qwen3-0.6B) -> a DCP folder to train from;
    # into a Parallax config the probes start at zero (exactly the Transformer's function)
    python -m scripts.export_hf import --config configs/paper/0.6B/parallax_muon_wsd.toml \
        --hf ~/Qwen3-0.6B --output outputs/qwen3_parallax_init
    torchrun ... train.py --job.config_file ... --checkpoint.initial_load_path outputs/qwen3_parallax_init

Extra ``--section.key value`` arguments override the config (e.g. ``--model.name transformer``).
``export`` checks the checkpoint's files against its checksum manifest before reading it (a corrupt
or truncated file, or a folder without a manifest: exit code 4; ``--no-verify`` loads it unchecked).
``import`` writes a manifest beside the DCP files, as the trainer does, so that folder verifies too.
``export`` refuses a weight that ``--dtype`` cannot hold (float16 overflows above 65504) or that is
not finite, naming it, before anything is written (exit code 2).
Both write ``--output`` whole (a failed run leaves an earlier output as it was) and refuse, before
reading anything, an ``--output`` that holds files other than such an output (exit code 2).
The format is described in eval/hf_format.py and docs/eval.md.
"""

from __future__ import annotations

import argparse
import sys

import torch

from eval.checkpoint import DTYPES, build_model, load_job_config, load_model, model_args_of
from eval.hf_format import check_export_folder, check_hf_config, export_hf, load_hf_state, read_hf_config, read_hf_state
from parallax_titan.checkpoint_files import DCP_OUTPUT, CheckpointError, check_output_folder, dcp_owned
from parallax_titan.checkpointing import save_checksummed
from parallax_titan.tokenizer import build_tokenizer


def export_command(args, overrides: list[str]) -> str:
    """DCP checkpoint -> Hugging Face folder; returns the folder."""
    job_config = load_job_config(args.config, overrides)
    # the cheap checks first: loading (and hashing) the checkpoint is the expensive part
    eos_id = build_tokenizer(job_config).eos_id
    check_export_folder(args.output, "--output")
    # read in float32 and cast at the export, which sees the values before the cast: a weight that
    # --dtype float16 cannot hold is refused, naming its magnitude, instead of written as inf
    model, _ = load_model(job_config, args.checkpoint, device="cpu", dtype="float32", verify=args.verify,
                          who="--checkpoint", off_switch="--no-verify")
    tokenizer_dir = None if args.no_tokenizer else job_config.model.hf_assets_path
    return export_hf(model, args.output, dtype=DTYPES[args.dtype], tokenizer_dir=tokenizer_dir, eos_id=eos_id,
                     key="--output", dtype_key="--dtype")


def import_command(args, overrides: list[str]) -> str:
    """Hugging Face folder -> DCP folder with the config's model weights and a checksum manifest;
    returns the folder."""
    job_config = load_job_config(args.config, overrides)
    check_output_folder(args.output, "--output", dcp_owned, DCP_OUTPUT)
    model_args = model_args_of(job_config)
    check_hf_config(read_hf_config(args.hf), model_args)  # before its weights are read
    model = build_model(model_args, torch.device("cpu"))
    load_hf_state(model, read_hf_state(args.hf))
    save_checksummed(model.state_dict(), args.output, key="--output")
    return args.output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scripts.export_hf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="DCP checkpoint -> safetensors + config.json")
    export.add_argument("--config", required=True, help="the run's training TOML")
    export.add_argument("--checkpoint", required=True, help="DCP folder <dump>/checkpoint/step-N")
    export.add_argument("--output", required=True, help="folder to write")
    export.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="storage dtype")
    export.add_argument("--no-tokenizer", action="store_true", help="do not copy the tokenizer")
    export.add_argument("--no-verify", dest="verify", action="store_false",
                        help="load the checkpoint without checking its files against its checksum manifest")
    imp = commands.add_parser("import", help="Hugging Face Qwen3 folder -> DCP folder")
    imp.add_argument("--config", required=True, help="training TOML of the target model (any variant)")
    imp.add_argument("--hf", required=True, help="folder with config.json and *.safetensors")
    imp.add_argument("--output", required=True,
                     help="DCP folder to write, with a checksum manifest (for checkpoint.initial_load_path)")
    return parser


def main(argv: list[str]) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    try:
        path = export_command(args, overrides) if args.command == "export" else import_command(args, overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
