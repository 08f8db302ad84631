"""DIVERSED (relaxed speculative decoding with a learned ensemble verifier) as a transformers ``custom_generate`` method.

    model.generate(input_ids, custom_generate="<this repo or a local copy>", trust_remote_code=True,
                   assistant_model=draft, diversed_head=head)

This file holds no algorithm: it calls ``diversed_hf.generation.diversed_generate``, so the ``diversed_hf`` package
must be installed (``requirements.txt``; transformers checks it before running this file). The model is used as it
is: nothing is added to its class.
"""

from diversed_hf.generation import diversed_generate


def generate(model, *args, **kwargs):
    """transformers' ``custom_generate`` entry point: ``model`` and every argument of ``model.generate``."""
    return diversed_generate(model, *args, **kwargs)
