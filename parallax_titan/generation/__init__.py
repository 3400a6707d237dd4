"""Inference: KV-cache generation for every variant, sampling, streaming text.

* :class:`KVCache` (static, per layer k/v in ``kernels.parallax_decode``'s layout) and
  :class:`RecurrentCache` (fla's state) in :mod:`.cache`;
* :class:`DecodeSession`: prefill prompts into cache rows, one decode step per token, optionally
  one CUDA graph per step (:mod:`.session`);
* :class:`SamplingParams`, :class:`Sampler`, :func:`token_ids`, :func:`token_probabilities` (:mod:`.sampling`);
* :class:`Generator`, :func:`generate`, :class:`StopCriteria`, :class:`Completion` (:mod:`.generate`);
* :class:`TextStream`: stop strings and streaming text (:mod:`.text`).

The model's side of the cached path is ``ParallaxQwen3Model.forward_cached`` (parallax_titan/model.py).
"""

from parallax_titan.generation.cache import KVCache, RecurrentCache
from parallax_titan.generation.generate import Completion, Generator, StopCriteria, generate
from parallax_titan.generation.sampling import Sampler, SamplingParams, token_ids, token_probabilities
from parallax_titan.generation.session import DecodeSession
from parallax_titan.generation.text import TextStream, cut_at_stop

__all__ = ["Completion", "DecodeSession", "Generator", "KVCache", "RecurrentCache", "Sampler", "SamplingParams",
           "StopCriteria", "TextStream", "cut_at_stop", "generate", "token_ids", "token_probabilities"]
