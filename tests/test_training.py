"""DiversedTrainer on tiny models: the objective's math by hand, rollouts, learning signals, checkpoints, errors."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset
from tiny_models import VOCAB_SIZE, make_model, make_pair
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from diversed_hf import DiversedHead
from diversed_hf.training import DiversedConfig, DiversedTrainer, load_head, objective
from diversed_hf.training.rollout import build_logits_warpers, mixture_logprobs, sample_from_mixture
from diversed_hf.verifiers import ops


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer of the tiny models: token i is the word ``t<i>``; pad 0, eos 1, bos 2."""
    vocab = {f"t{i}": i for i in range(VOCAB_SIZE)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t3"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="t0", eos_token="t1", bos_token="t2", unk_token="t3"
    )


def prompts_dataset(num_prompts: int = 8, seed: int = 0) -> Dataset:
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(num_prompts):
        length = int(torch.randint(3, 7, (1,), generator=generator))
        prompts.append(" ".join(f"t{int(i)}" for i in torch.randint(4, VOCAB_SIZE, (length,), generator=generator)))
    return Dataset.from_dict({"prompt": prompts, "reference": ["t5"] * num_prompts})


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def config(tmp_path, **overrides) -> DiversedConfig:
    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        learning_rate=5e-2,
        lambda_acceptance=1.0,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_pin_memory=False,
    )
    values.update(overrides)
    return DiversedConfig(**values)


def trainer_for(tmp_path, target=None, draft=None, reward=zero_reward, dataset=None, head=None, **overrides):
    if target is None:
        target, draft = make_pair(noise=0.5)
    return DiversedTrainer(
        target,
        draft,
        head=head,
        reward_funcs=reward,
        args=config(tmp_path, **overrides),
        train_dataset=dataset if dataset is not None else prompts_dataset(),
        processing_class=tiny_tokenizer(),
    )


def head_params(head) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in head.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# The objective, by hand


def test_reinforce_pp_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    advantages = objective.reinforce_pp_advantages(rewards, mask, group_size=2, use_group_baseline=True)
    # Baselined rewards 0.5, -0.5, 0, 0 broadcast over the 7 valid tokens: mean 1/14, std sqrt(5)/7.
    root5 = math.sqrt(5)
    expected = torch.tensor([[3 / root5, 3 / root5], [-4 / root5, 0.0], [-0.5 / root5] * 2, [-0.5 / root5] * 2])
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)
    valid = advantages[mask.bool()]
    assert abs(float(valid.mean())) < 1e-6 and abs(float(valid.std(unbiased=False)) - 1) < 1e-5


def test_advantages_without_baseline_and_with_kl_to_go():
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.ones(2, 3)
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0]])
    advantages = objective.reinforce_pp_advantages(rewards, mask, token_kl=kl, kl_coef=1.0)
    returns = torch.tensor([[1 - 0.6, 1 - 0.5, 1 - 0.3], [0.0, 0.0, 0.0]])  # reward minus the KL still to come
    expected = (returns - returns.mean()) / (returns.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(advantages, expected)
    # Identical rewards carry no signal: the advantage is exactly zero.
    assert torch.equal(objective.reinforce_pp_advantages(torch.ones(4), torch.ones(4, 2)), torch.zeros(4, 2))


def test_clipped_policy_loss_by_hand():
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.1]])
    advantages = torch.tensor([[1.0, -1.0, -1.0, 1.0, 2.0]])
    loss, clipped = objective.clipped_policy_loss(ratio.log(), torch.zeros_like(ratio), advantages, 0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.5, 0.8, -0.5, -2.2]]))
    assert clipped.tolist() == [[True, False, True, False, False]]


def test_acceptance_is_one_minus_tv_of_draft_and_mixture():
    generator = torch.Generator().manual_seed(0)
    target_probs = torch.rand(3, 5, 11, generator=generator).softmax(-1)
    draft_probs = torch.rand(3, 5, 11, generator=generator).softmax(-1)
    w = torch.rand(3, 5, generator=generator)
    mixture = ops.mix_probs(draft_probs, target_probs, w)
    expected = 1 - ops.total_variation(draft_probs, mixture)
    torch.testing.assert_close(
        objective.expected_acceptance(w, ops.total_variation(target_probs, draft_probs)), expected
    )


def test_kl_estimators():
    logprobs = torch.tensor([[-1.0, -2.0]])
    assert torch.equal(objective.kl_k3(logprobs, logprobs), torch.zeros(1, 2))
    assert bool((objective.kl_k3(logprobs, logprobs - 0.5) > 0).all())
    torch.testing.assert_close(objective.kl_k1(logprobs, logprobs - 0.5), torch.full((1, 2), 0.5))


# ---------------------------------------------------------------------------------------------
# Rollouts


@pytest.mark.parametrize("repeated", [False, True])
def test_rollout_matches_teacher_forced_mixture(repeated):
    """Cached, left-padded, batched sampling gives exactly the nu, TV and w of a full forward pass; with repeated
    prompts (a group's samples: the prefill reads each distinct prompt once) every row still continues its own."""
    target, draft = make_pair(noise=0.5)
    head = DiversedHead.for_pair(target, draft, w_0=0.3)
    torch.nn.init.normal_(head.net[-1].weight, std=0.1)
    ids = torch.randint(4, VOCAB_SIZE, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0
    if repeated:  # rows 0..5: prompts 1, 0, 1, 2, 0, 1
        order = torch.tensor([1, 0, 1, 2, 0, 1])
        ids, mask = ids[order], mask[order]
    temperature, top_k = 0.7, 20
    rollout = sample_from_mixture(
        target,
        draft,
        head,
        ids,
        mask,
        max_new_tokens=7,
        temperature=temperature,
        top_k=top_k,
        eos_token_id=1,
        generator=torch.Generator().manual_seed(0),
    )
    warpers = build_logits_warpers(temperature, top_k)
    for row in range(ids.shape[0]):
        prompt = ids[row][mask[row].bool()]
        length = int(rollout.completion_mask[row].sum())
        tokens = rollout.completion_ids[row, :length]
        full = torch.cat([prompt, tokens])[None]
        start = prompt.numel() - 1
        with torch.no_grad():
            target_out, draft_out = target(full, output_hidden_states=True), draft(full, output_hidden_states=True)
            positions = slice(start, start + length)
            target_probs = warpers(full, target_out.logits[0, positions].float()).softmax(-1)
            draft_probs = warpers(full, draft_out.logits[0, positions].float()).softmax(-1)
            w = head(draft_out.hidden_states[-1][:, positions], target_out.hidden_states[-1][:, positions])[0]
        logprobs = mixture_logprobs(
            w, target_probs.gather(1, tokens[:, None])[:, 0], draft_probs.gather(1, tokens[:, None])[:, 0]
        )
        torch.testing.assert_close(rollout.logprobs[row, :length], logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(rollout.target_weight[row, :length], w, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            rollout.total_variation[row, :length], ops.total_variation(target_probs, draft_probs), atol=1e-5, rtol=0
        )


def test_rollout_samples_from_the_mixture():
    """With w = 1 the first token follows the target's distribution (TV bound at this sample size)."""
    from tiny_models import empirical, tv_bound

    target, draft = make_pair(noise=0.5)
    head = DiversedHead.for_pair(target, draft, w_0=0.999999)
    ids = torch.randint(4, VOCAB_SIZE, (1, 5), generator=torch.Generator().manual_seed(1)).repeat(4000, 1)
    rollout = sample_from_mixture(
        target, draft, head, ids, max_new_tokens=1, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        expected = target(ids[:1]).logits[0, -1].float().softmax(-1)
    observed = empirical(rollout.completion_ids[:, 0], VOCAB_SIZE)
    assert float(0.5 * (observed - expected.double()).abs().sum()) < tv_bound(expected, 4000)


# ---------------------------------------------------------------------------------------------
# Learning signals


def acceptance_rate(target, draft, head, seed: int = 0) -> float:
    """Measured speculative-decoding acceptance rate of ``head`` on fixed prompts (N = 3)."""
    from diversed_hf import enable_diversed

    enable_diversed(target)
    ids = torch.randint(4, VOCAB_SIZE, (16, 5), generator=torch.Generator().manual_seed(123))
    out = target.generate(
        ids,
        assistant_model=draft,
        diversed_head=head,
        do_sample=True,
        max_new_tokens=16,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return out.speculation.total_acceptance_rate


def test_zero_reward_with_lambda_raises_acceptance(tmp_path):
    target, draft = make_pair(noise=0.5)
    trainer = trainer_for(tmp_path, target, draft, lambda_acceptance=2.0, max_steps=6)
    initial = copy.deepcopy(trainer.model)
    trainer.train()
    trained = trainer.model
    logs = [h for h in trainer.state.log_history if "acceptance_proxy" in h]
    assert logs[-1]["mean_w"] < logs[0]["mean_w"] - 0.1
    assert logs[-1]["acceptance_proxy"] > logs[0]["acceptance_proxy"]
    before = sum(acceptance_rate(target, draft, initial, seed) for seed in range(3))
    after = sum(acceptance_rate(target, draft, trained, seed) for seed in range(3))
    assert after > before + 0.03 * 3


def test_reward_alone_moves_w_toward_target_when_draft_tokens_lose(tmp_path):
    """Reward = share of completion tokens the target likes more than the draft; lambda = 0."""
    target, draft = make_pair(noise=0.5)
    tokenizer = tiny_tokenizer()

    def target_preferred(prompts, completions, completion_ids, **kwargs):
        scores = []
        for prompt, tokens in zip(prompts, completion_ids):
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            full = torch.tensor([prompt_ids + tokens])
            with torch.no_grad():
                positions = slice(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(tokens))
                target_probs = target(full).logits[0, positions].float().softmax(-1)
                draft_probs = draft(full).logits[0, positions].float().softmax(-1)
            index = torch.tensor(tokens)[:, None]
            wins = target_probs.gather(1, index) > draft_probs.gather(1, index)
            scores.append(float(wins.float().mean()))
        return scores

    trainer = trainer_for(
        tmp_path,
        target,
        draft,
        reward=target_preferred,
        lambda_acceptance=0.0,
        max_steps=12,
        learning_rate=0.1,
        num_iterations=2,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "mean_w" in h]
    assert logs[0]["mean_w"] == pytest.approx(0.5, abs=1e-6)
    late = sum(h["mean_w"] for h in logs[-3:]) / 3
    assert late > 0.6, [h["mean_w"] for h in logs]


def test_clip_fraction_is_zero_on_policy_and_positive_after_big_steps(tmp_path):
    trainer = trainer_for(tmp_path / "a", reward=lambda completions, **k: [float(len(c)) for c in completions])
    trainer.train()
    assert all(h["clip_fraction"] == 0.0 for h in trainer.state.log_history if "clip_fraction" in h)
    trainer = trainer_for(
        tmp_path / "b",
        reward=lambda completions, **k: [float(len(c) % 7) for c in completions],
        num_iterations=4,
        learning_rate=1.0,
        lambda_acceptance=0.0,
        max_steps=8,
    )
    trainer.train()
    assert max(h["clip_fraction"] for h in trainer.state.log_history if "clip_fraction" in h) > 0.0


def test_logged_metrics(tmp_path):
    trainer = trainer_for(tmp_path, max_steps=1)
    trainer.train()
    logged = trainer.state.log_history[0]
    for key in ("reward", "mean_w", "acceptance_proxy", "acceptance_exact_sd", "kl", "clip_fraction", "loss"):
        assert key in logged, key
    assert 0.0 <= logged["acceptance_exact_sd"] <= logged["acceptance_proxy"] <= 1.0


# ---------------------------------------------------------------------------------------------
# Checkpoints


def test_checkpoints_hold_only_the_head_and_resume_exactly(tmp_path):
    common = dict(max_steps=4, num_iterations=2, beta=0.1, kl_estimator="k1", learning_rate=0.05)
    straight = trainer_for(tmp_path / "straight", **common)
    straight.train()

    first = trainer_for(tmp_path / "resumed", save_strategy="steps", save_steps=1, **common)
    first.train()
    checkpoint = tmp_path / "resumed" / "out" / "checkpoint-1"  # mid-cycle: the rollout buffer is reused after it
    files = {p.name for p in checkpoint.iterdir()}
    assert {"model.safetensors", "config.json", "diversed_pair.json", "optimizer.pt", "trainer_state.json"} <= files
    head_bytes = (checkpoint / "model.safetensors").stat().st_size
    assert head_bytes < 4096, "the checkpoint must hold the head only, not the models"

    resumed = trainer_for(tmp_path / "resumed", save_strategy="no", **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for key, value in head_params(straight.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key


def test_saved_head_loads_and_gives_the_same_weights(tmp_path):
    trainer = trainer_for(tmp_path, max_steps=2)
    trainer.train()
    trainer.save_model(str(tmp_path / "head"))
    loaded = load_head(tmp_path / "head")
    hidden_q, hidden_p = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    torch.testing.assert_close(loaded(hidden_q, hidden_p), trainer.model(hidden_q, hidden_p))


def test_resuming_with_another_pair_is_refused(tmp_path):
    trainer = trainer_for(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    trainer.train()
    other_target, other_draft = make_pair(noise=0.5, seed=7)  # same sizes, other weights
    other = trainer_for(tmp_path, other_target, other_draft, max_steps=2)
    with pytest.raises(ValueError, match="another \\(target, draft\\) pair"):
        other.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))


# ---------------------------------------------------------------------------------------------
# Bad input


def test_reward_of_wrong_length_is_an_error(tmp_path):
    trainer = trainer_for(tmp_path, reward=lambda completions, **k: [0.0] * (len(completions) - 1), max_steps=1)
    with pytest.raises(ValueError, match="returned 7 rewards for 8 completions"):
        trainer.train()


@pytest.mark.parametrize("bad", [float("nan"), None])
def test_nan_reward_is_an_error(tmp_path, bad):
    trainer = trainer_for(tmp_path, reward=lambda completions, **k: [bad] + [0.0] * (len(completions) - 1), max_steps=1)
    with pytest.raises(ValueError, match="rewards must be finite floats"):
        trainer.train()


@pytest.mark.parametrize("bad", ["42", "high", {"a": 1.0}, [1.0], 1 + 0j, torch.ones(1), b"1"], ids=repr)
def test_a_reward_that_is_not_a_real_number_is_refused_naming_the_function(tmp_path, bad):
    """A string "42" used to train as 42.0 (``float()``); a value must be a real number."""

    def shouting(completions, **kwargs):
        return [bad] + [0.0] * (len(completions) - 1)

    trainer = trainer_for(tmp_path, reward=shouting, max_steps=1)
    with pytest.raises(TypeError, match=r"reward function 'shouting' returned .* for completion 0 .*a real number"):
        trainer.train()


@pytest.mark.parametrize("returned", [{i: 1.0 for i in range(8)}, "t5" * 4, 3.0], ids=["dict", "str", "float"])
def test_a_reward_function_returning_no_list_is_refused(returned):
    """A dict of 8 would have been scored by its keys (0..7), a string of 8 by its characters."""
    from diversed_hf.training.scoring import score_completions

    rows = [{"prompt": "t4"}] * 8
    with pytest.raises(TypeError, match=r"reward function 'f' returned a (dict|str|float) .*a list of 8 floats"):
        score_completions([lambda **k: returned], ["f"], rows, ["t4"] * 8, ["t5"] * 8, [[5]] * 8, None)


def test_rewards_accept_real_numbers_of_every_kind_and_none_as_not_scored():
    import fractions

    import numpy as np

    from diversed_hf.training.scoring import score_completions, weighted_rewards

    values = [
        1,
        True,
        0.5,
        np.float32(0.25),
        np.int64(3),
        np.bool_(True),
        np.array(2.0),
        torch.tensor(-1.5),
        fractions.Fraction(1, 4),
        torch.tensor(True),
    ]
    n = len(values)
    rows = [{"prompt": "t4", "reference": "t5"}] * n

    def everything(completions, reference, **kwargs):  # dataset columns arrive as keyword arguments
        assert reference == ["t5"] * n
        return values

    def first_half(completions, **kwargs):  # TRL's None: this function does not score the completion
        return [10.0] * (n // 2) + [None] * (n - n // 2)

    rewards = score_completions(
        [everything, first_half], ["everything", "first_half"], rows, ["t4"] * n, ["t5"] * n, [[5]] * n, None
    )
    expected = [1.0, 1.0, 0.5, 0.25, 3.0, 1.0, 2.0, -1.5, 0.25, 1.0]
    assert rewards[:, 0].tolist() == expected
    assert rewards[: n // 2, 1].tolist() == [10.0] * (n // 2) and rewards[n // 2 :, 1].isnan().all()
    weighted = weighted_rewards(rewards, torch.tensor([1.0, 0.5]))  # None leaves the function out of the sum
    assert weighted.tolist() == [r + 5.0 for r in expected[: n // 2]] + expected[n // 2 :]


def test_training_with_a_function_that_scores_some_completions(tmp_path):
    def some(completions, **kwargs):
        return [1.0 if i % 2 else None for i in range(len(completions))]

    trainer = trainer_for(tmp_path, reward=[zero_reward, some], max_steps=1, logging_steps=1)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["rewards/some/mean"] == 1.0 and logged["reward"] == 0.5  # mean over what it scored; the sum over both


@pytest.mark.parametrize("huge", [1e39, -3e20])
def test_rewards_beyond_float32_are_an_error_naming_the_function(tmp_path, huge):
    def exploding(completions, **kwargs):
        return [huge] + [0.0] * (len(completions) - 1)

    trainer = trainer_for(tmp_path, reward=exploding, max_steps=1)
    with pytest.raises(ValueError, match=r"reward function 'exploding' returned .* beyond float32's range"):
        trainer.train()


def test_dataset_without_prompt_column_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"lacks the columns \['prompt'\]"):
        trainer_for(tmp_path, dataset=Dataset.from_dict({"question": ["t4 t5"]}))


@pytest.mark.parametrize("rows", [0, 1])
def test_a_dataset_too_small_for_one_rollout_batch_is_refused(tmp_path, rows):
    """0 rows (or fewer than one rollout batch's prompts) used to train 0 of max_steps steps without a word."""
    with pytest.raises(ValueError, match=rf"`train_dataset` has {rows} rows, but one rollout batch takes 2 prompts"):
        trainer_for(tmp_path, dataset=prompts_dataset(rows))
    with pytest.raises(ValueError, match=r"`eval_dataset` has no rows"):
        DiversedTrainer(
            *make_pair(),
            reward_funcs=zero_reward,
            args=config(tmp_path),
            train_dataset=prompts_dataset(),
            eval_dataset=prompts_dataset(0),
            processing_class=tiny_tokenizer(),
        )


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_models_in_another_dtype_train_a_float32_head(tmp_path, dtype):
    """The rollout's hidden states come in the models' dtype; the head trains in float32 (both used to fail)."""
    target, draft = make_pair(noise=0.5)
    trainer = trainer_for(tmp_path, target.to(dtype), draft.to(dtype), max_steps=2)
    before = head_params(trainer.model)
    trainer.train()
    after = head_params(trainer.model)
    assert all(value.dtype == torch.float32 and value.isfinite().all() for value in after.values())
    assert any(not torch.equal(before[key], after[key]) for key in before)


def test_a_non_finite_loss_stops_training_and_a_nan_head_is_never_saved(tmp_path):
    trainer = trainer_for(tmp_path, max_steps=1)
    b, t, d = 2, 3, 32
    inputs = {
        "completion_mask": torch.ones(b, t),
        "target_token_probs": torch.full((b, t), 0.5),
        "draft_token_probs": torch.full((b, t), 0.5),
        "total_variation": torch.full((b, t), float("nan")),
        "draft_hidden": torch.zeros(b, t, d),
        "target_hidden": torch.zeros(b, t, d),
        "features": torch.zeros(b, t, 0),
        "old_logprobs": torch.zeros(b, t),
        "ref_logprobs": torch.zeros(b, t),
        "advantages": torch.zeros(b, t),
    }
    assert trainer.compute_head_loss(trainer.model, {**inputs, "total_variation": torch.zeros(b, t)}).isfinite()
    with pytest.raises(FloatingPointError, match=r"The loss is not finite at step 0 .*the head would become NaN"):
        trainer.compute_head_loss(trainer.model, inputs)
    with torch.no_grad():
        trainer.model.net[0].bias.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"NaN or infinite values \(`net.0.bias`\): it is not saved"):
        trainer.save_model(str(tmp_path / "head"))
    assert not (tmp_path / "head" / "model.safetensors").exists()


def test_vocabulary_mismatch_is_an_error(tmp_path):
    target = make_model(vocab_size=VOCAB_SIZE)
    draft = make_model(vocab_size=VOCAB_SIZE + 400, seed=1)
    with pytest.raises(ValueError, match="same token ids"):
        trainer_for(tmp_path, target, draft)


def test_unwritable_output_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="is not writable"):
        trainer_for(tmp_path, output_dir=str(blocker / "out"))


def test_logit_space_head_is_refused(tmp_path):
    target, draft = make_pair()
    head = DiversedHead.for_pair(target, draft, mixing="logits")
    with pytest.raises(ValueError, match="mixing='probs'"):
        trainer_for(tmp_path, target, draft, head=head)


def test_config_validation():
    with pytest.raises(ValueError, match="lambda_acceptance"):
        DiversedConfig(output_dir="x", lambda_acceptance=-1.0, report_to="none")
    with pytest.raises(ValueError, match="kl_estimator"):
        DiversedConfig(output_dir="x", kl_estimator="k2", report_to="none")
    for name in ("epsilon", "epsilon_high"):
        with pytest.raises(ValueError, match=rf"`{name}` \(the PPO clip\) is -0.1; it must be >= 0"):
            DiversedConfig(output_dir="x", report_to="none", **{name: -0.1})
    with pytest.raises(ValueError, match=r"`head_mlp_hidden_size` is 64, but .* `head_architecture` is 'linear'"):
        DiversedConfig(output_dir="x", report_to="none", head_mlp_hidden_size=64)
    import dataclasses

    fields = {f.name for f in dataclasses.fields(DiversedConfig)}
    backends = [
        n for n in ("use_vllm", "use_transformers_continuous_batching", "use_transformers_paged") if n in fields
    ]
    assert (
        "use_vllm" in backends and len(backends) >= 2
    )  # and continuous batching, `use_transformers_paged` before TRL 1.8
    for name in backends:
        with pytest.raises(
            ValueError, match=r"`use_\w+=True` is not supported: rollouts sample from the two-model mixture"
        ):
            DiversedConfig(output_dir="x", report_to="none", **{name: True})


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "name, value",
    [
        ("lambda_acceptance", NAN),
        ("beta", NAN),
        ("epsilon", NAN),
        ("epsilon_high", INF),
        ("temperature", NAN),
        ("learning_rate", NAN),
        ("top_p", NAN),
        ("lambda_acceptance", INF),
        ("reward_weights", [1.0, NAN]),
    ],
)
def test_config_refuses_non_finite_floats(name, value):
    """NaN passes every `< 0` check: lambda_acceptance=NaN used to train, and save, a NaN head."""
    with pytest.raises(ValueError, match=rf"`{name}` is .*(nan|inf).* must be a finite number"):
        DiversedConfig(output_dir="x", report_to="none", **{name: value})


def test_yaml_no_is_a_strategy_not_false(tmp_path):
    """YAML 1.1 reads `save_strategy: no` as False; it means the strategy "no"."""
    import train_head

    path = tmp_path / "run.yaml"
    path.write_text(
        "task: testbed_arith\nsave_strategy: no\neval_strategy: no\nlogging_strategy: no\nreport_to: none\n"
    )
    _, parsed = train_head.parse_arguments(["--config", str(path), "--output_dir", str(tmp_path / "out")])
    assert (parsed.save_strategy, parsed.eval_strategy, parsed.logging_strategy) == ("no", "no", "no")
    assert DiversedConfig(output_dir="x", report_to="none", save_strategy=False).save_strategy == "no"
    with pytest.raises(ValueError, match=r"`save_strategy` is True .*'no', 'steps' or 'epoch'"):
        DiversedConfig(output_dir="x", report_to="none", save_strategy=True)


def test_import_diversed_hf_does_not_import_trl():
    code = "import sys, diversed_hf, diversed_hf.training.rollout, diversed_hf.lab.tasks; print('trl' in sys.modules)"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_evaluate_logs_eval_metrics(tmp_path):
    trainer = trainer_for(tmp_path, max_steps=1)
    trainer.eval_dataset = prompts_dataset(4, seed=5)
    metrics = trainer.evaluate()
    assert {"eval_loss", "eval_reward", "eval_mean_w", "eval_acceptance_proxy"} <= set(metrics)


def test_log_completions_writes_the_completions_table(tmp_path):
    trainer = trainer_for(tmp_path, max_steps=1, log_completions=True, num_completions_to_print=1)
    trainer.train()
    import pandas as pd

    (table,) = (tmp_path / "out" / "completions").iterdir()
    frame = pd.read_parquet(table)
    assert {"prompt", "completion", "zero_reward", "advantage"} <= set(frame.columns) and len(frame) == 8


# ---------------------------------------------------------------------------------------------
# Reward functions as TRL calls them: async ones, log_metric and log_extra


def length_reward(completions, **kwargs):
    return [float(len(c) % 5) for c in completions]


async def async_length_reward(completions, **kwargs):
    import asyncio

    await asyncio.sleep(0)
    return length_reward(completions)


class AsyncLengthReward:
    async def __call__(self, completions, **kwargs):
        return length_reward(completions)


@pytest.mark.parametrize("reward", [async_length_reward, AsyncLengthReward()], ids=["function", "callable object"])
def test_an_async_reward_function_trains_exactly_as_its_synchronous_twin(tmp_path, reward):
    sync = trainer_for(tmp_path / "sync", reward=length_reward, max_steps=2)
    sync.train()
    trainer = trainer_for(tmp_path / "async", reward=[reward, zero_reward], max_steps=2)
    trainer.train()
    for key, value in head_params(sync.model).items():
        assert torch.equal(value, trainer.model.state_dict()[key]), key
    name = "async_length_reward" if reward is async_length_reward else "AsyncLengthReward"
    rewards = [h[f"rewards/{name}/mean"] for h in trainer.state.log_history if f"rewards/{name}/mean" in h]
    assert rewards == [h["reward"] for h in sync.state.log_history if "reward" in h]


def test_an_async_reward_function_errors_name_it(tmp_path):
    async def short(completions, **kwargs):
        return [0.0]

    with pytest.raises(ValueError, match=r"The reward function 'short' returned 1 rewards for 8 completions"):
        trainer_for(tmp_path, reward=short, max_steps=1).train()


def test_reward_functions_log_metrics_and_completion_columns(tmp_path):
    """``log_metric`` values reach the logs (averaged per logging step, eval-prefixed in evaluation); ``log_extra``
    columns reach the completions table, row by row."""

    def logging_reward(completions, completion_ids, log_metric, log_extra, **kwargs):
        lengths = [len(ids) for ids in completion_ids]
        log_metric("mean_tokens", sum(lengths) / len(lengths))
        log_extra("tokens", lengths)
        return [0.0] * len(completions)

    trainer = trainer_for(tmp_path, reward=logging_reward, max_steps=2, log_completions=True)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "mean_tokens" in h]
    assert len(logged) == 2
    for entry in logged:
        assert entry["mean_tokens"] == pytest.approx(entry["completions/mean_length"])
    import pandas as pd

    tables = sorted((tmp_path / "out" / "completions").iterdir())
    frame = pd.read_parquet(tables[-1])
    assert {"tokens", "logging_reward", "advantage"} <= set(frame.columns) and len(frame) == 8
    assert frame["tokens"].mean() == pytest.approx(logged[-1]["mean_tokens"])  # the last batch's rows, in order

    trainer.eval_dataset = prompts_dataset(4, seed=5)
    assert "eval_mean_tokens" in trainer.evaluate()


def test_log_extra_with_one_value_too_few_is_refused_naming_the_column(tmp_path):
    def bad(completions, log_extra, **kwargs):
        log_extra("score", [1] * (len(completions) - 1))
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"logged 7 values in the column 'score' for a batch of 8 completions"):
        trainer_for(tmp_path, reward=bad, max_steps=1).train()


# ---------------------------------------------------------------------------------------------
# Batching: prompts grouped G at a time, one rollout batch per `steps_per_generation` micro-steps


def test_grouped_sampler_draws_groups_and_repeats_each_draw():
    from diversed_hf.training.batches import GroupedSampler

    sampler = GroupedSampler(range(7), group_size=2, prompts_per_batch=3, repeat_count=2, shuffle=False)
    assert list(sampler) == [0, 0, 1, 1, 2, 2] * 2 + [3, 3, 4, 4, 5, 5] * 2  # prompt 6 is a partial draw: dropped
    assert len(sampler) == 24
    order = torch.randperm(7, generator=torch.Generator().manual_seed(3)).tolist()
    shuffled = list(GroupedSampler(range(7), group_size=2, prompts_per_batch=3, repeat_count=1, seed=3))
    assert shuffled == [i for i in order[:6] for _ in range(2)]
    try:  # TRL's own (internal) sampler, where this TRL still has it: the same order, epoch after epoch
        from trl.trainer.utils import RepeatSampler
    except ImportError:
        return
    ours = GroupedSampler(range(10), group_size=4, prompts_per_batch=2, repeat_count=3, seed=7)
    trls = RepeatSampler(range(10), mini_repeat_count=4, batch_size=2, repeat_count=3, seed=7)
    assert [list(ours) for _ in range(3)] == [list(trls) for _ in range(3)]


def test_rollout_buffer_generates_once_per_cycle_and_serves_every_row_once_per_pass():
    from diversed_hf.training.batches import RolloutBuffer

    calls = []

    def generate(rows):
        calls.append(rows)
        return {"row": torch.tensor(rows), "scalar": torch.tensor(1.0)}

    buffer = RolloutBuffer(steps_per_generation=2, num_iterations=3)
    served = []
    for step in range(12):
        served.append(buffer.micro_batch(list(range(10 * len(calls), 10 * len(calls) + 4)), generate)["row"].tolist())
        buffer.step += 1
    assert len(calls) == 2  # every steps_per_generation * num_iterations = 6 micro-steps
    for cycle in range(2):
        passes = [sorted(served[6 * cycle + 2 * i] + served[6 * cycle + 2 * i + 1]) for i in range(3)]
        assert passes == [calls[cycle]] * 3


# ---------------------------------------------------------------------------------------------
# TRL's surface: the tested version range; the trainer on transformers' and TRL's public API only

#: The trainer's own private names; anything else starting with "_" would be a TRL / transformers member.
OWN_PRIVATES = {
    "_rollout_generator",
    "_prompt_texts",
    "_global_advantages",
    "_model_device",
    "_sample_rollout",
    "_log_rollout",
}


def test_trainer_source_names_no_private_trl_or_transformers_member():
    import ast

    from transformers import Trainer

    import diversed_hf.training.trainer as trainer_module

    tree = ast.parse(Path(trainer_module.__file__).read_text())
    found = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.ClassDef):
            names += [item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
            names += [
                t.id
                for item in node.body
                if isinstance(item, ast.Assign)
                for t in item.targets
                if isinstance(t, ast.Name)
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        ):
            names += [a.value for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        for name in names:
            if (
                name.startswith("_")
                and not (name.startswith("__") and name.endswith("__"))
                and name not in OWN_PRIVATES
            ):
                found.setdefault(name, node.lineno)
    assert not found, f"trainer.py names TRL / transformers privates: {found}"
    shadowed = sorted(name for name in OWN_PRIVATES if hasattr(Trainer, name))
    assert not shadowed, f"the trainer's own privates shadow transformers.Trainer members: {shadowed}"


def test_the_trainer_sets_no_attribute_a_plain_trainer_has_and_overrides_only_public_methods(tmp_path):
    """Every attribute DiversedTrainer adds is its own (a plain Trainer has none of them), and every Trainer method it
    overrides is a public one."""
    from transformers import Trainer

    trainer = trainer_for(tmp_path)
    plain = Trainer(model=torch.nn.Linear(2, 2), args=config(tmp_path / "plain"))
    added = set(vars(trainer)) - set(vars(plain))
    assert added and not {name for name in added if hasattr(plain, name)}
    assert not {name for name in added if name.startswith("_") and name not in OWN_PRIVATES}, added
    overridden = {name for name in vars(DiversedTrainer) if hasattr(Trainer, name) and not name.startswith("__")}
    assert "training_step" in overridden and not {name for name in overridden if name.startswith("_")}, overridden


def test_check_trl_version(monkeypatch):
    import trl

    from diversed_hf import compat

    low, high = compat.TESTED_TRL
    compat.check_trl_version()  # the installed version is a tested one
    below = f"{low.major - 1}.99.0" if low.major else f"0.{max(low.minor - 1, 0)}.0"
    for outside in (below, str(high), f"{high.major + 1}.0.0"):
        monkeypatch.setattr(trl, "__version__", outside)
        with pytest.raises(
            ImportError, match=rf"trl >={low},<{high}; found {outside}.*pip install 'trl>={low},<{high}'"
        ):
            compat.check_trl_version()
    monkeypatch.setattr(trl, "__version__", str(low))
    compat.check_trl_version()


def test_the_package_admits_the_tested_trl_range_and_ci_tests_its_lower_end():
    """pyproject's `train` extra, compat.TESTED_TRL and .ci/constraints-lowest.txt name the same range."""
    import re

    from packaging.specifiers import SpecifierSet

    from diversed_hf import compat

    root = Path(__file__).resolve().parents[1]
    low, high = compat.TESTED_TRL
    (spec,) = re.findall(r'"trl([<>=!~][^"]*)"', (root / "pyproject.toml").read_text())
    admitted = SpecifierSet(spec)
    assert admitted.contains(str(low)) and not admitted.contains(f"{low}.dev0", prereleases=True), (spec, low)
    assert not admitted.contains(str(high)), (spec, high)
    constraints = (root / ".ci" / "constraints-lowest.txt").read_text().splitlines()
    assert f"trl=={low}" in constraints, constraints
