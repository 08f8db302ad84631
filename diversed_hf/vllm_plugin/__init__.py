"""DIVERSED inside vLLM: a ``vllm.general_plugins`` plugin (``pip install "diversed_hf[vllm]"``).

With the plugin installed, a vLLM engine with a draft model (``"method": "draft_model"``, or ``"eagle"`` with an
``EagleDraft.save_for_vllm`` export) verifies drafts against the mixture
``nu_t = w_t p_t + (1 - w_t) q_t`` of target ``p`` and draft ``q`` instead of ``p`` when its ``additional_config``
asks for it (README, "Serving with vLLM")::

    llm = LLM(model=target, dtype="float32",
              speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 3,
                                  "draft_sample_method": "probabilistic"},
              additional_config={"diversed": {"head": "path/or/repo-id"}})  # or {"target_weight": 0.5}
    llm.generate(prompts, SamplingParams(extra_args={"diversed": {"target_weight": 1.0}}))  # this request: lossless

    vllm serve TARGET --speculative-config '{...}' --additional-config '{"diversed": {"target_weight": 0.5}}'

``w_t`` is a static weight (:class:`~diversed_hf.verifiers.StaticEnsembleVerifier`) or comes from a
:class:`~diversed_hf.heads.head.DiversedHead`, which may read both models' last-layer hidden states (the plugin keeps
them from vLLM's target pass and drafting steps). Each request may pick its own rule among the engine's (a weight, or a
head the engine loaded, by name) through ``SamplingParams.extra_args["diversed"]``, or ``"diversed"`` in an OpenAI
request's body; requests with different rules share a batch. Sampled output follows each request's ``nu_t`` at
drafted positions and ``p`` at bonus positions; greedy output is ``generate(..., verifier=...)``'s (docs/method.md
§2). Acceptance shows in vLLM's own spec-decoding metrics (``vllm:spec_decode_num_accepted_tokens`` and friends).

Modules: :mod:`.settings` (the ``additional_config["diversed"]`` and per-request keys, checked), :mod:`.mixture`
(``nu_t`` from vLLM's tensors, each request by its own rule, via the project's verifiers), :mod:`.patches` (every
vLLM internal touched, with the vLLM release it was written for), :mod:`.versions` (the tested vLLM releases; other
releases refuse only the engines asking for DIVERSED). Nothing else in ``diversed_hf`` imports this package.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in every process it starts, before building an engine.

    In a vLLM release the plugin was written for (:data:`.versions.SUPPORTED_VLLM`) it installs the patches; in any
    other it patches nothing, logs a warning, and makes only engines that ask for DIVERSED (an
    ``additional_config["diversed"]`` entry) fail at construction with a ``RuntimeError`` naming the fix.
    """
    import vllm

    from .versions import guard_unsupported_vllm, is_supported_vllm

    if not is_supported_vllm(vllm.__version__):
        from vllm.config import VllmConfig

        guard_unsupported_vllm(VllmConfig, vllm.__version__)
        return
    from .patches import install

    install()
