"""Hugging Face remote code for Parallax checkpoints: ``configuration_parallax.py`` and
``modeling_parallax.py``, copied beside ``config.json`` by ``eval.hf_format.export_hf`` so that
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` loads them. Both are
self-contained (torch and transformers; ``kernels`` only if importable), so that transformers can
load them from an exported folder; here they are also ordinary modules, tested directly.
"""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))
REMOTE_CODE_FILES = ("configuration_parallax.py", "modeling_parallax.py")
AUTO_MAP = {
    "AutoConfig": "configuration_parallax.ParallaxQwen3Config",
    "AutoModelForCausalLM": "modeling_parallax.ParallaxQwen3ForCausalLM",
}
