"""lm-eval model class for Parallax-Titan checkpoints (every variant: Transformer, Parallax, daggers).

Scoring follows lm-eval's conventions for causal LMs: the end-of-document token
``<|endoftext|>`` conditions an empty context and the first window of a rolling score; inputs
longer than the model's window keep their last ``max_length`` tokens; log-probabilities are
computed in float32 from the model's logits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from eval.checkpoint import load_job_config, load_model
from parallax_titan.generation import Generator, SamplingParams, StopCriteria
from parallax_titan.generation.cache import ATTENTION_MIXERS
from parallax_titan.tokenizer import build_tokenizer

MODEL_NAME = "parallax_titan"
DEFAULT_MAX_GEN_TOKS = 256
# lm-eval's model_args keys (config and checkpoint required); the rest are from_checkpoint's arguments.
MODEL_ARGS = ("config", "checkpoint", "device", "dtype", "batch_size", "max_length", "max_gen_toks", "verify")
# What lm-eval hands every model besides model_args; the adapter takes these two when set.
ADDITIONAL_CONFIG = ("device", "batch_size")

# (the (context, continuation) strings or None for rolling windows, context ids, continuation ids)
Request = tuple[tuple[str, str] | None, list[int], list[int]]


def positive_int(name: str, value) -> int:
    """``value`` as a positive integer (an int or its digits); ValueError naming ``name`` otherwise."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number <= 0 or str(number) != str(value).strip():
        raise ValueError(f"{name}: got {value!r}; expected a positive integer")
    return number


def window_length(value) -> int:
    """``max_length`` as given (an int or its digits): 0 for the config's ``training.seq_len``, else a
    positive integer; ValueError naming ``max_length`` otherwise (``model_args`` passes text)."""
    return 0 if str(value).strip() == "0" else positive_int("max_length", value)


def _flag(name: str, value, where: str = "model_args:") -> bool:
    """A boolean given as True/False or its text ``true``/``false`` (lm-eval passes ``model_args``
    bools, a quoted value stays a string); ValueError naming ``where`` and ``name`` otherwise: a truthy
    string such as "no" must not switch anything on."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{where} {name}={value} is not a boolean; expected {name}=true or {name}=false")


def _gen_number(key: str, value, default: float, integer: bool = False) -> float:
    """A ``gen_kwargs`` number (a number or its text; None: ``default``); ValueError naming ``key``
    and the value otherwise, or, with ``integer``, for one with a fractional part."""
    if value is None:
        return default
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number) or (integer and (not math.isfinite(number) or number != int(number))):
        expected = "an integer" if integer else "a number"
        raise ValueError(f"generate_until: gen_kwargs {key}={value!r} is not {expected}; expected e.g. "
                         f"{key}={default!r} (the default)")
    return number


def _chunks(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


@register_model(MODEL_NAME)
class ParallaxLM(TemplateLM):
    """A Parallax-Titan model and its run's tokenizer, scored for lm-eval.

    Build it with :meth:`from_checkpoint` (TOML config + DCP folder) or :meth:`from_job_config`.
    ``batch_size`` sequences go through the model at once, right-padded with the end-of-document
    token; causal attention keeps padding from reaching any scored position. Generation runs on a
    KV cache of ``batch_size`` x ``max_length`` (``graph``: decode steps as CUDA graphs; None = on
    CUDA for the attention variants); ``seed`` seeds sampled generation.

    distributed: one instance per rank of the default ``torch.distributed`` group, each with its
    own full model; lm-eval then gives each rank a share of every task's documents and gathers
    the per-document scores on rank 0 (the forward itself runs no collective).
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 8, max_length: int = 0,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, graph: bool | None = None, seed: int = 1234,
                 distributed: bool = False):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = positive_int("batch_size", batch_size)
        self._max_length = positive_int("max_length", max_length or model.model_args.max_seq_len)
        if self._max_length > model.model_args.max_seq_len:
            raise ValueError(
                f"max_length: got {self._max_length}; the model's RoPE table holds "
                f"{model.model_args.max_seq_len} positions"
            )
        self.max_gen_toks = positive_int("max_gen_toks", max_gen_toks)
        self._device = next(model.parameters()).device
        self.graph, self.seed = graph, seed
        self._generator: Generator | None = None
        if distributed and dist.is_initialized():
            self._rank, self._world_size = dist.get_rank(), dist.get_world_size()

    @classmethod
    def from_job_config(cls, job_config, checkpoint_dir: str, *, device=None, dtype="auto",
                        batch_size: int = 8, max_length: int = 0, max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
                        verify: bool = True, who: str = "checkpoint", off_switch: str = "verify=False",
                        checked=None):
        """A parsed JobConfig + a DCP checkpoint folder -> ParallaxLM (model in eval mode).

        verify: check the folder's files against its checksum manifest first (a corrupt or truncated
        file, or no manifest, raises CheckpointError naming ``who``, the file and ``off_switch``);
        see :func:`eval.checkpoint.load_checkpoint`. ``batch_size``, ``max_length`` and ``max_gen_toks``
        are checked before anything is read. ``checked``: :func:`eval.checkpoint.check_job_checkpoint`'s
        verdict on the folder, taken instead of reading its metadata again (:func:`load_model`)."""
        positive_int("batch_size", batch_size)
        max_length = window_length(max_length)
        positive_int("max_gen_toks", max_gen_toks)
        model, _ = load_model(job_config, checkpoint_dir, device=device, dtype=dtype, max_length=max_length,
                              verify=verify, who=who, off_switch=off_switch, checked=checked)
        return cls(model, build_tokenizer(job_config), batch_size=batch_size, max_length=max_length,
                   max_gen_toks=max_gen_toks)

    @classmethod
    def from_checkpoint(cls, config_path: str, checkpoint_dir: str, *, device=None, dtype="auto",
                        batch_size: int = 8, max_length: int = 0, max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
                        overrides: Sequence[str] = (), verify: bool = True, who: str = "checkpoint",
                        off_switch: str = "verify=False"):
        """A training TOML (+ ``--section.key value`` overrides) and a DCP checkpoint -> ParallaxLM.

        device: "cpu", "cuda", "cuda:1", or None (CUDA when available). dtype: "auto" (bf16 on
        CUDA, fp32 on CPU), "float32", "bfloat16" or "float16". max_length: the scoring window,
        0 = the config's ``training.seq_len``. verify: check the checkpoint's checksums first
        (:meth:`from_job_config`).
        """
        job_config = load_job_config(config_path, overrides)
        return cls.from_job_config(job_config, checkpoint_dir, device=device, dtype=dtype,
                                   batch_size=batch_size, max_length=max_length, max_gen_toks=max_gen_toks,
                                   verify=verify, who=who, off_switch=off_switch)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """lm-eval's ``--model parallax_titan --model_args config=X.toml,checkpoint=DIR[,dtype=..][,verify=false]``.

        The checkpoint's checksums are checked first; ``verify=false`` loads it unchecked."""
        from lm_eval.utils import simple_parse_args_string

        return cls._from_model_args(simple_parse_args_string(arg_string), additional_config, repr(arg_string))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's ``simple_evaluate(model="parallax_titan", model_args={"config": ..., "checkpoint": ...})``:
        the same keys as :meth:`create_from_arg_string`."""
        return cls._from_model_args(dict(arg_dict), additional_config, repr(arg_dict))

    @classmethod
    def _from_model_args(cls, args: dict, additional_config: dict | None, shown: str):
        """model_args (keys of :data:`MODEL_ARGS`) plus lm-eval's ``device`` and ``batch_size`` when set
        -> :meth:`from_checkpoint`. ValueError naming ``model_args`` for a missing or unknown key, and
        for a ``device`` or ``batch_size`` that model_args and lm-eval give with different values."""
        for key in ("config", "checkpoint"):
            if key not in args:
                raise ValueError(f"model_args: {key}= is missing in {shown}; expected config=X.toml,checkpoint=DIR")
        unknown = sorted(set(args) - set(MODEL_ARGS))
        if unknown:
            raise ValueError(f"model_args: unknown {unknown} in {shown}; expected keys from {list(MODEL_ARGS)}")
        # None: not given (simple_evaluate's defaults); a 0 is given and checked, not dropped for the default
        extra = {k: v for k, v in (additional_config or {}).items() if k in ADDITIONAL_CONFIG and v is not None}
        # The lm_eval command always sets both (batch_size 1 and device cuda:0 unless --batch_size and
        # --device are given), so one of two differing values would be dropped silently; which one the
        # user meant cannot be told.
        clashes = [f"{k}={args[k]!r} in model_args but {extra[k]!r} from lm-eval" for k in ADDITIONAL_CONFIG
                   if k in args and k in extra and str(args[k]).strip() != str(extra[k]).strip()]
        if clashes:
            raise ValueError(f"model_args: {'; '.join(clashes)}; expected the same value in both (the lm_eval "
                             "command always passes its --batch_size, default 1, and --device, default cuda:0: "
                             "give them there)")
        config, checkpoint = args.pop("config"), args.pop("checkpoint")
        verify = _flag("verify", args.pop("verify", True))
        return cls.from_checkpoint(config, checkpoint, **{**args, **extra}, verify=verify,
                                   who="model_args checkpoint", off_switch="verify=false in model_args")

    # ------------------------------------------------------------------ ranks (lm-eval's distributed API)
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` of every rank, stacked along a new first dimension (world_size, ...)."""
        if self.world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def gather_object(self, obj, dst: int = 0):
        """Every rank's ``obj`` as a list on rank ``dst``, None on the others."""
        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # ------------------------------------------------------------------ tokenizer and shapes
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def max_length(self) -> int:
        """Scoring window in tokens (the training sequence length unless overridden)."""
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "tokenizer_path", "parallax_titan"))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Text -> token ids, no BOS/EOS (the run's documents carry no BOS)."""
        return self.tokenizer.encode(string, add_bos=False, add_eos=False)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens))

    # ------------------------------------------------------------------ model calls
    @torch.no_grad()
    def _logits(self, rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """Right-pad ``rows`` (each <= max_length tokens) and run the model.

        Returns logits (batch, longest, vocab) in the model dtype and the row lengths.
        """
        lengths = [len(r) for r in rows]
        tokens = torch.full((len(rows), max(lengths)), self.eot_token_id, dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        tokens = tokens.to(self.device)
        masks = self.model.get_attention_masks(tokens, self.tokenizer)  # as in training; None when causal
        return self.model(tokens, attention_masks=masks), lengths

    def _score_batch(self, batch: list[Request]) -> list[tuple[float, bool]]:
        rows, conts = [], []
        for _, context, continuation in batch:
            if not continuation:
                raise ValueError("loglikelihood: empty continuation; expected at least one token to score")
            if len(continuation) > self.max_length:
                raise ValueError(
                    f"loglikelihood: continuation of {len(continuation)} tokens exceeds max_length {self.max_length}"
                )
            rows.append((context + continuation)[-(self.max_length + 1) : -1])
            conts.append(continuation)
        logits, lengths = self._logits(rows)
        results = []
        for i, (cont, length) in enumerate(zip(conts, lengths)):
            logprobs = F.log_softmax(logits[i, length - len(cont) : length].float(), dim=-1)
            target = torch.tensor(cont, device=logprobs.device)
            score = float(logprobs.gather(-1, target[:, None]).sum())
            greedy = bool((logprobs.argmax(dim=-1) == target).all())
            results.append((score, greedy))
        return results

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False, **kwargs):
        """(pair, context ids, continuation ids) -> [(sum log p(continuation | context), is_greedy)].

        Batches are formed longest first so the largest allocation happens at the start.
        """
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        with tqdm(total=len(requests), desc="loglikelihood", disable=disable_tqdm) as bar:
            for indices in _chunks(order, self.batch_size):
                for index, answer in zip(indices, self._score_batch([requests[i] for i in indices])):
                    results[index] = answer
                    if requests[index][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[index][0], answer)
                bar.update(len(indices))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Full log-likelihood of each text, scored in windows of ``max_length`` tokens.

        The first window predicts the first token from ``<|endoftext|>``; each later window
        predicts up to ``max_length`` new tokens conditioned on the tokens just before them, so
        every token is scored exactly once (lm-eval's rolling windows with context length 1).
        """
        windows, owners = [], []
        for index, request in enumerate(requests):
            tokens = self.tok_encode(request.args[0])
            for context, continuation in map(
                make_disjoint_window, get_rolling_token_windows(tokens, self.eot_token_id, self.max_length, 1)
            ):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[owner] += score
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ------------------------------------------------------------------ generation
    def _request_settings(self, gen_kwargs: dict) -> tuple[SamplingParams, StopCriteria]:
        """lm-eval's generation arguments -> how to sample and when to stop.

        ``until`` (stop strings; ``<|endoftext|>`` is always one), ``max_gen_toks``, ``do_sample``,
        ``temperature``, ``top_k``, ``top_p``, read as lm-eval's ``normalize_gen_kwargs`` reads them:
        ``temperature`` is 0 unless given, and sampling (seeded with the adapter's ``seed``) needs
        ``temperature`` > 0 and ``do_sample`` not false; otherwise greedy, so ``do_sample=False`` and
        ``temperature=0`` are both greedy whatever the other says. A value that is not a number
        (``top_k`` an integer, ``do_sample`` a boolean) or out of range raises ValueError naming the
        key and the value, also when decoding is greedy.
        """
        kwargs = dict(gen_kwargs)
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = positive_int("max_gen_toks", kwargs.pop("max_gen_toks", self.max_gen_toks))
        do_sample = kwargs.pop("do_sample", None)
        do_sample = None if do_sample is None else _flag("do_sample", do_sample, "generate_until: gen_kwargs")
        temperature = _gen_number("temperature", kwargs.pop("temperature", None), 0.0)
        top_k = int(_gen_number("top_k", kwargs.pop("top_k", None), 0, integer=True))
        top_p = _gen_number("top_p", kwargs.pop("top_p", None), 1.0)
        if kwargs:
            raise ValueError(f"generate_until: unsupported generation arguments {sorted(kwargs)} in {gen_kwargs!r}; "
                             "expected until, max_gen_toks, do_sample, temperature, top_k, top_p")
        try:  # checks the ranges (temperature >= 0, top_k >= 0, 0 < top_p <= 1) even when greedy
            requested = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=self.seed)
        except ValueError as exc:
            raise ValueError(f"generate_until: gen_kwargs {exc}") from None
        sampling = requested if do_sample is not False and temperature > 0 else SamplingParams()
        stops = tuple(until) + (self.tok_decode([self.eot_token_id]),)
        return sampling, StopCriteria(max_new_tokens=max_new, stop=stops, stop_token_ids=(self.eot_token_id,))

    @property
    def generator(self) -> Generator:
        """The cached-generation engine: ``batch_size`` rows of ``max_length`` positions (built once)."""
        if self._generator is None:
            graph = self.graph
            if graph is None:
                graph = self.device.type == "cuda" and self.model.model_args.mixer in ATTENTION_MIXERS
            self._generator = Generator(self.model, batch_size=self.batch_size, capacity=self.max_length, graph=graph,
                                        document_end=self.eot_token_id)
        return self._generator

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Generation from each context until a stop string, ``<|endoftext|>`` or ``max_gen_toks``,
        through the KV cache. Requests with the same sampling settings run together, longest
        context first, ``batch_size`` at a time; a context longer than ``max_length`` keeps its
        last tokens, and so does a sequence that outgrows it (the window slides, each new token
        seeing the last ``max_length``). Models trained with block-causal masks see the same
        document masks as in scoring.

        Returns the generated text cut before the first stop string.
        """
        contexts = [self.tok_encode(r.args[0]) or [self.eot_token_id] for r in requests]
        settings = [self._request_settings(r.args[1] if len(r.args) > 1 else {}) for r in requests]
        groups: dict[SamplingParams, list[int]] = {}
        for index, (sampling, _) in enumerate(settings):
            groups.setdefault(sampling, []).append(index)
        results: list[str | None] = [None] * len(requests)
        with tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm) as bar:
            for sampling, members in groups.items():
                order = sorted(members, key=lambda i: -len(contexts[i]))
                completions = self.generator.generate(
                    [contexts[i] for i in order], sampling, [settings[i][1] for i in order],
                    decode=self.tok_decode, overflow="slide")
                for index, completion in zip(order, completions):
                    results[index] = completion.text
                    self.cache_hook.add_partial("generate_until", requests[index].args, completion.text)
                bar.update(len(members))
        return results
