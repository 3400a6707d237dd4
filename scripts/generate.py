"""Generate text from a checkpoint, streaming it to the terminal.

    python -m scripts.generate --config X.toml --checkpoint OUT/checkpoint/step-N --prompt "Once upon a time" \
        [--max-new-tokens 128] [--temperature 0.8 --top-k 50 --top-p 0.95 --repetition-penalty 1.1 --seed 0] \
        [--stop $'\n\n'] [--device cuda] [--dtype bfloat16] [--max-length N] [--no-graph] [--no-verify] \
        [--section.key value ...]

Temperature 0 (the default) is greedy. Several ``--prompt`` run one after another. The model runs
on its KV cache; on CUDA the attention variants decode through one CUDA graph per step. Extra
``--section.key value`` arguments override the config. The checkpoint's files are checked against
its checksum manifest before it is loaded (a corrupt or truncated file, or a folder without a
manifest: exit code 4); ``--no-verify`` loads it unchecked. The Python API is
``parallax_titan.generation`` (docs in its package docstring and the README).
"""

from __future__ import annotations

import argparse
import sys

from eval.checkpoint import load_job_config, load_model, model_args_of, resolve_device
from parallax_titan.checkpoint_files import CheckpointError
from parallax_titan.config import ConfigError
from parallax_titan.generation import Generator, SamplingParams, StopCriteria
from parallax_titan.generation.cache import ATTENTION_MIXERS
from parallax_titan.tokenizer import build_tokenizer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scripts.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the run's training TOML")
    parser.add_argument("--checkpoint", required=True, help="DCP folder <dump>/checkpoint/step-N")
    parser.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for several)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0,
                        help="keep the k most likely tokens (0 = all; needs --temperature > 0)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="nucleus: keep tokens up to this probability mass (needs --temperature > 0)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeated tokens")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws (default: random)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeat for several)")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at <|endoftext|>")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--max-length", type=int, default=0,
                        help="positions of the RoPE table and the cache's limit (0 = training.seq_len)")
    parser.add_argument("--no-graph", action="store_true", help="decode eagerly instead of through a CUDA graph")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="load the checkpoint without checking its files against its checksum manifest")
    return parser


def run(args, overrides: list[str], out=None) -> list[str]:
    """Generate for every prompt of ``args`` (parsed by :func:`build_parser`), writing the text to
    ``out`` (default: the current ``sys.stdout``) as it comes; returns the completions' texts."""
    out = sys.stdout if out is None else out
    resolve_device(args.device, "--device")  # a device this machine lacks: before the checkpoint is hashed
    if "" in args.stop:  # dropped by the text stream: generation would run to --max-new-tokens
        raise ValueError("--stop: got '', which stops nothing; expected a non-empty stop string")
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed)
    # greedy decoding takes the argmax: a truncation of the draw would be ignored without a word (a seed is
    # harmless there, the output being the same for every seed, so scripts may always pass one)
    if sampling.greedy:
        for flag, value, off in (("--top-k", args.top_k, 0), ("--top-p", args.top_p, 1.0)):
            if value != off:
                raise ValueError(f"{flag}: {value} has no effect with --temperature 0 (greedy decoding takes the most "
                                 f"likely token, with no draw); pass --temperature > 0 to sample, or leave {flag} out")
    job_config = load_job_config(args.config, overrides)
    tokenizer = build_tokenizer(job_config)
    # every argument is checked before the checkpoint is verified and loaded (minutes for a large model)
    stopping = StopCriteria(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop),
                            stop_token_ids=() if args.ignore_eos else (tokenizer.eos_id,))
    prompts = [tokenizer.encode(p, add_bos=False, add_eos=False) or [tokenizer.eos_id] for p in args.prompt]
    longest = max(len(p) for p in prompts) + args.max_new_tokens
    positions = model_args_of(job_config, args.max_length).max_seq_len
    if longest > positions:
        raise ValueError(f"max_length: a prompt plus --max-new-tokens needs {longest} positions, the model has "
                         f"{positions}; pass --max-length {longest} (or fewer new tokens)")
    model, model_args = load_model(job_config, args.checkpoint, device=args.device, dtype=args.dtype,
                                   max_length=args.max_length, verify=args.verify, who="--checkpoint",
                                   off_switch="--no-verify")
    device = next(model.parameters()).device
    graph = not args.no_graph and device.type == "cuda" and model_args.mixer in ATTENTION_MIXERS
    generator = Generator(model, batch_size=1, capacity=longest, graph=graph, document_end=tokenizer.eos_id)
    texts = []
    for text, prompt in zip(args.prompt, prompts):
        out.write(text)
        out.flush()
        write = lambda _, piece: (out.write(piece), out.flush())
        completion = generator.generate([prompt], sampling, stopping, decode=tokenizer.decode, on_text=write)[0]
        out.write("\n")
        texts.append(completion.text)
    return texts


def main(argv: list[str]) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    try:
        run(args, overrides)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
