"""Configuration of Qwen3 with Parallax attention for Hugging Face transformers (remote code).

Exported beside ``config.json`` by Parallax-Titan (``python -m scripts.export_hf export``); loaded by
``AutoConfig.from_pretrained(dir, trust_remote_code=True)``. Self-contained: imports transformers only.
"""

from transformers import PretrainedConfig

GATES = ("none", "token", "head")
MASK_TYPES = ("causal", "block_causal")
PARALLAX_DEFAULTS = {"rho_rope": True, "gate": "none", "attn_mask_type": "causal"}
# The fields a checkpoint's config.json must give: a default taken for one left out (rope_theta 1e6,
# rms_norm_eps 1e-6, the sizes of Qwen3-0.6B) computes another model than the weights were trained as.
CHECKPOINT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "rms_norm_eps",
                     "tie_word_embeddings")
SIZE_FIELDS = CHECKPOINT_FIELDS[:8]  # positive integers


def missing_parallax_keys(block: dict) -> list[str]:
    """The keys of :data:`PARALLAX_DEFAULTS` that ``block`` leaves out, sorted."""
    return sorted(set(PARALLAX_DEFAULTS) - set(block))


def checked_parallax(block, eos_token_id) -> dict:
    """A copy of ``block``, the ``parallax`` settings the modeling code reads, after checking that it
    is a dict giving every key of :data:`PARALLAX_DEFAULTS` (a key left out would leave a model
    built later on another setting than the one it had) and nothing else, with values the modeling
    code computes; a block-causal mask needs one ``eos_token_id`` (the id ending a document).

    Raises ValueError naming the key, the value and what was expected."""
    if not isinstance(block, dict):
        raise ValueError(f"parallax: expected a dict with keys {sorted(PARALLAX_DEFAULTS)}, got {block!r}")
    unknown = sorted(set(block) - set(PARALLAX_DEFAULTS))
    if unknown:  # a misspelt key would leave its field at the default without a word
        raise ValueError(f"parallax: unknown keys {unknown}; expected {sorted(PARALLAX_DEFAULTS)}")
    missing = missing_parallax_keys(block)
    if missing:
        raise ValueError(f"parallax: missing keys {missing} in {block!r}; expected every key of "
                         f"{sorted(PARALLAX_DEFAULTS)} (the defaults fill only a config being built)")
    if not isinstance(block["rho_rope"], bool):  # "false" would be true
        raise ValueError(f"parallax.rho_rope: expected true or false, got {block['rho_rope']!r}")
    if block["gate"] not in GATES:
        raise ValueError(f"parallax.gate: expected one of {GATES}, got {block['gate']!r}")
    if block["attn_mask_type"] not in MASK_TYPES:
        raise ValueError(f"parallax.attn_mask_type: expected one of {MASK_TYPES}, got {block['attn_mask_type']!r}")
    if block["attn_mask_type"] == "block_causal" and (isinstance(eos_token_id, bool)
                                                      or not isinstance(eos_token_id, int)):
        raise ValueError(f"eos_token_id: parallax.attn_mask_type = 'block_causal' ends a document after "
                         f"eos_token_id, which must be one token id; got {eos_token_id!r}")
    return dict(block)


def field_problem(key: str, value) -> str | None:
    """What is wrong with ``value`` for the config field ``key`` (a size: a positive integer;
    ``rope_theta``, ``rms_norm_eps``: a positive finite number; ``tie_word_embeddings``: a boolean),
    or None. A string or null read from a config.json edited by hand would otherwise fail deep in
    torch, or (``rms_norm_eps`` null: torch's own epsilon) compute another model."""
    if key in SIZE_FIELDS:
        ok, expected = isinstance(value, int) and not isinstance(value, bool) and value > 0, "a positive integer"
    elif key == "tie_word_embeddings":
        ok, expected = isinstance(value, bool), "true or false"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
        expected = "a positive number"
    return None if ok else f"{key}: expected {expected}, got {value!r}"


class ParallaxQwen3Config(PretrainedConfig):
    """Qwen3's fields plus ``parallax``: ``rho_rope`` (RoPE on the probe), ``gate`` ("none",
    "token", "head": a sigmoid gate on the probe after its norm) and ``attn_mask_type`` ("causal",
    or "block_causal": no attention across ``eos_token_id``, documents as in training).

    Built in code (a new model), the ``parallax`` keys left out take :data:`PARALLAX_DEFAULTS`; read
    from a checkpoint (:meth:`from_dict`, :meth:`from_json_file`) or assigned after construction
    (``config.parallax = {...}``, which replaces the whole block) every key must be there.

    Raises ValueError naming the field for what the modeling code would not compute: an unknown
    ``parallax`` key or a ``parallax`` that is not a dict, a block-causal model without one
    ``eos_token_id``, a RoPE scaling (``rope_scaling`` / ``rope_parameters`` of a type other than
    "default"), a sliding window or attention chunks (``sliding_window``, ``use_sliding_window``,
    ``attention_chunk_size``, ``layer_types``), an activation other than silu, biases, attention
    dropout (none is computed); and a size, ``rope_theta``, ``rms_norm_eps`` or
    ``tie_word_embeddings`` of the wrong type (:func:`field_problem`)."""

    model_type = "parallax_qwen3"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(self, vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                 max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                 attention_bias=False, use_cache=True, initializer_range=0.02, parallax=None, bos_token_id=None,
                 eos_token_id=None, pad_token_id=None, **kwargs):
        given = {"vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
                 "num_hidden_layers": num_hidden_layers, "num_attention_heads": num_attention_heads,
                 "num_key_value_heads": num_key_value_heads, "head_dim": head_dim,
                 "max_position_embeddings": max_position_embeddings, "rope_theta": rope_theta,
                 "rms_norm_eps": rms_norm_eps, "tie_word_embeddings": tie_word_embeddings}
        problem = next(filter(None, (field_problem(key, value) for key, value in given.items())), None)
        if problem:
            raise ValueError(problem)
        for key in ("rope_scaling", "rope_parameters"):  # the modeling code computes plain RoPE only
            rope = kwargs.get(key) or {}
            kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
            if kind != "default":
                raise ValueError(f"{key}: rope type {kind!r}; Parallax-Qwen3 has plain RoPE (expected none or "
                                 "'default')")
            if isinstance(rope, dict) and rope.get("rope_theta", rope_theta) != rope_theta:
                raise ValueError(f"{key}: rope_theta = {rope['rope_theta']!r} disagrees with rope_theta = "
                                 f"{rope_theta!r}")
        # transformers builds generate's cache from these (a "sliding_attention" or chunked layer keeps
        # only the last sliding_window keys), while this model attends to the whole causal prefix
        windows = {key: kwargs[key] for key in ("sliding_window", "attention_chunk_size")
                   if kwargs.get(key) is not None}
        if kwargs.get("use_sliding_window"):
            windows["use_sliding_window"] = kwargs["use_sliding_window"]
        layer_types = kwargs.get("layer_types")
        if layer_types is not None and (not isinstance(layer_types, (list, tuple))
                                        or any(kind != "full_attention" for kind in layer_types)):
            windows["layer_types"] = layer_types
        if windows:
            key, value = next(iter(windows.items()))
            raise ValueError(f"{key}: {value!r}; Parallax-Qwen3 attends to the whole causal prefix (expected "
                             "sliding_window and attention_chunk_size null, use_sliding_window false, layer_types "
                             "'full_attention' only)")
        if hidden_act != "silu" or attention_bias:
            raise ValueError(f"hidden_act / attention_bias: Parallax-Qwen3 uses silu without biases, got "
                             f"{hidden_act!r} / {attention_bias!r}")
        if kwargs.get("attention_dropout"):  # Qwen3 drops attention weights in training; this model has none to drop
            raise ValueError(f"attention_dropout: {kwargs['attention_dropout']!r}; Parallax-Qwen3 computes no "
                             "attention dropout (expected 0)")
        if num_attention_heads % num_key_value_heads:
            raise ValueError(f"num_attention_heads: {num_attention_heads} is not a multiple of num_key_value_heads "
                             f"= {num_key_value_heads}")
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads, self.head_dim, self.hidden_act = num_key_value_heads, head_dim, hidden_act
        self.max_position_embeddings, self.rope_theta, self.rms_norm_eps = max_position_embeddings, rope_theta, rms_norm_eps
        self.attention_bias, self.use_cache, self.initializer_range = attention_bias, use_cache, initializer_range
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(tie_word_embeddings=tie_word_embeddings, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)
        # transformers 5's base config no longer defines them: a config without them would fail at
        # the first forward, which reads eos_token_id (block-causal documents)
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        if parallax is None or isinstance(parallax, dict):  # a new model: the keys left out take the defaults
            parallax = {**PARALLAX_DEFAULTS, **(parallax or {})}
        self.parallax = parallax  # checked by __setattr__, against the eos_token_id set just above

    def __setattr__(self, key, value):
        """Every ``parallax`` set, in ``__init__`` or later (``config.parallax = {...}``, transformers'
        ``from_dict`` and ``update``), goes through :func:`checked_parallax` and is stored as a copy:
        a model built from the config computes what the config says; a field of
        :data:`CHECKPOINT_FIELDS` through :func:`field_problem` (``from_pretrained``'s keywords are
        set after ``__init__``). A bad value raises ValueError and leaves the old one."""
        if key == "parallax":
            value = checked_parallax(value, getattr(self, "eos_token_id", None))
        elif key in CHECKPOINT_FIELDS and (problem := field_problem(key, value)):
            raise ValueError(problem)
        super().__setattr__(key, value)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """The config of a checkpoint (transformers' ``from_pretrained`` and ``AutoConfig`` read
        config.json through this). It must give every field of :data:`CHECKPOINT_FIELDS` and every
        key of its ``parallax`` block, as exports and ``save_pretrained`` write them: a default taken
        for one left out (``rope_theta`` 1e6 for a model trained with 1e4, ``rho_rope`` true for a
        model trained without it) computes another model. A keyword of the same name (``parallax``
        replacing the block) completes a config.json without it.

        Raises ValueError naming the missing fields and keys."""
        if "parallax" in kwargs:
            config_dict = {**config_dict, "parallax": kwargs.pop("parallax")}
        missing = [key for key in CHECKPOINT_FIELDS if key not in config_dict and key not in kwargs]
        block = config_dict.get("parallax")
        if block is None:
            missing.append("parallax")
        elif isinstance(block, dict):  # a block of another type is refused by __init__
            missing += [f"parallax.{key}" for key in missing_parallax_keys(block)]
        if missing:
            raise ValueError(f"config.json: missing {', '.join(missing)}; a checkpoint's config gives each field the "
                             "model computes with and every key of parallax, as the export and save_pretrained write "
                             "them (the defaults, such as rope_theta 1e6 and parallax "
                             f"{PARALLAX_DEFAULTS}, are for a new model built in code)")
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file):
        """The config in ``json_file``, read as a checkpoint's (:meth:`from_dict`)."""
        return cls.from_dict(cls._dict_from_json_file(json_file))
