"""The paper's downstream tasks (SPEC.md section 4), in the paper's order. Imports nothing heavy."""

PAPER_SUITE = (
    "lambada_openai", "wikitext", "boolq", "hellaswag", "piqa",
    "arc_easy", "arc_challenge", "winogrande", "openbookqa", "sciq",
)
