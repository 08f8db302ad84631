"""How long each row drafts: every draft-length schedule in one place.

========== ================================================================================================
``policy`` ``DraftLengthPolicy``: transformers' draft-length knobs (``num_assistant_tokens``, the ``constant`` /
           ``heuristic`` / ``heuristic_transient`` schedules, the confidence threshold) and ``optimal``, resolved
           once per call and checked
``optimal`` the ``"optimal"`` schedule's state across calls: the stopping rule and the per-row estimator
``costs``  what a round costs: ``DraftCosts`` (``assistant_costs=``) and the costs measured from timed rounds
========== ================================================================================================
"""
