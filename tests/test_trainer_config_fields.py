"""Every GRPO field DiversedTrainer does not read is refused by name when set; the fields it reads are accepted."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from diversed_hf.training.config import HONOURED_GRPO_FIELDS, DiversedConfig  # noqa: E402


@pytest.mark.parametrize(
    "values",
    [
        dict(loss_type="dr_grpo"),
        dict(scale_rewards="none"),
        dict(importance_sampling_level="sequence"),
        dict(top_entropy_quantile=0.5),
        dict(mask_truncated_completions=True),
        dict(vllm_mode="server"),
        dict(delta=2.0),
        dict(sync_ref_model=True),
        dict(generation_kwargs={"min_new_tokens": 4}),
        dict(repetition_penalty=1.2),
    ],
)
def test_a_grpo_option_the_trainer_does_not_implement_is_refused_by_name(values, tmp_path):
    ((name, value),) = values.items()
    with pytest.raises(ValueError, match=rf"does not implement `{name}={value!r}`.*Remove them"):
        DiversedConfig(output_dir=str(tmp_path), **values)


def test_several_are_named_together_and_the_honoured_ones_pass(tmp_path):
    with pytest.raises(ValueError) as refused:
        DiversedConfig(output_dir=str(tmp_path), loss_type="bnpo", min_p=0.1)
    assert "`loss_type='bnpo'` (GRPO's default: " in str(refused.value) and "`min_p=0.1`" in str(refused.value)
    config = DiversedConfig(
        output_dir=str(tmp_path),
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        beta=0.01,
        epsilon=0.1,
        num_iterations=2,
        num_generations=2,
        per_device_train_batch_size=2,
        reward_weights=[1.0],
        log_completions=True,
        shuffle_dataset=False,
    )
    assert config.temperature == 0.7 and {"temperature", "beta", "reward_weights"} <= HONOURED_GRPO_FIELDS
