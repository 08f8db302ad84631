"""The metrics of the harness-format tasks (docs/lm_eval.md), as the project's own tasks score them: arith_chat by
exact match of the final number (``diversed_hf.lab.tasks.rewards.exact_match``: the first number after the last
``####``, else the last number), synopsis by ROUGE-2 F1 against the reference sentence (``rouge2_f1``)."""

from diversed_hf.lab.tasks.rewards import exact_match as _exact_match
from diversed_hf.lab.tasks.rewards import rouge2_f1


def exact_match(doc, results):
    return {"exact_match": _exact_match([results[0]], [doc["answer"]])[0]}


def rouge2(doc, results):
    return {"rouge2": rouge2_f1(results[0].strip(), doc["answer"])}
