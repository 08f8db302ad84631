"""Rewards of the testbed tasks: the library's own (:mod:`diversed_hf.lab.tasks.rewards`).

* ``arith``   -- GSM8K exact match of the final number (:func:`~diversed_hf.lab.tasks.rewards.exact_match`):
  the number after the last ``####`` if there is one, else the last number in the text; commas are
  removed; ``"27"``, ``"27.0"`` and ``"$27"`` all match 27.
* ``summary`` -- ROUGE-2 F1 in ``[0, 1]`` (:func:`~diversed_hf.lab.tasks.rewards.rouge2`): a reference
  may hold several acceptable summaries, one per line, and the score is the best F1 over them.
"""

from __future__ import annotations

from ..lab.tasks.rewards import exact_match as arith_reward
from ..lab.tasks.rewards import extract_final_number, rouge2_f1  # noqa: F401 - part of this module's API
from ..lab.tasks.rewards import rouge2 as summary_reward

REWARDS = {"arith": arith_reward, "summary": summary_reward}
