"""DIVERSED (relaxed speculative decoding with a learned ensemble verifier) as a transformers ``custom_generate``
method.

    model.generate(input_ids, custom_generate="<this repo or a local copy>", trust_remote_code=True,
                   assistant_model=draft, diversed_head=head)

This file holds no algorithm: it calls ``diversed_hf.generation.diversed_generate``, so the ``diversed_hf`` package
must be installed (``requirements.txt``; transformers checks it before running this file). The model is used as it
is: nothing is added to its class.
"""

from diversed_hf.generation import diversed_generate


def generate(*args, **kwargs):
    """transformers' ``custom_generate`` entry point: the model and every argument of ``model.generate``.

    transformers passes the model in two ways: ``generate(model=model, ...)`` for ``custom_generate=`` and, when
    this folder is in the model's own repository and it is loaded with ``trust_remote_code=True``, as
    ``model.generate = partial(generate, model=model)``, so ``model.generate(input_ids)`` arrives as
    ``generate(input_ids, model=model)``. A direct call ``generate(model, input_ids, ...)`` works too."""
    if "model" in kwargs:
        model = kwargs.pop("model")
    elif args:
        model, args = args[0], args[1:]
    else:
        raise TypeError(
            "`generate` needs the model: `generate(model, input_ids, ...)` or `generate(input_ids, model=model)`."
        )
    return diversed_generate(model, *args, **kwargs)
