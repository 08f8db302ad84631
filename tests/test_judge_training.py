"""Training a judge (training/train_judge.py, diversed_hf.training.judge_labels) on the testbed: labels mined as
AutoJudge mines them, resumable and tied to their settings, a judge that loads and runs in JudgeVerifier."""

from __future__ import annotations

import json

import pytest
import torch

from diversed_hf import JudgeHead


def test_a_judge_is_mined_trained_measured_and_saved(tmp_path):
    import train_judge

    argv = ["--task", "testbed_arith", "--output_dir", str(tmp_path / "run"), "--num_train_examples", "30"]
    argv += ["--max_new_tokens", "48", "--eval_num_examples", "4", "--threads", "1"]
    saved = train_judge.main(argv)
    judge = JudgeHead.from_pretrained(saved)
    assert judge.config.task == "arith" and judge.config.hidden_size == 192
    record = json.loads((saved / "training.json").read_text())
    assert record["judge"]["num_swaps"] > 10 and 0 < record["judge"]["harmless_share"] < 1
    assert {"SD", "judge"} <= set(record["measured"]) and "quality_minus_sd" in record["measured"]["judge"]
    shard = next((tmp_path / "run" / "labels").glob("shard-*.safetensors"))
    stamp = shard.stat().st_mtime_ns
    train_judge.main([*argv, "--eval_num_examples", "0"])  # resumed: the mined shard is kept, not mined again
    assert shard.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="labels mined with other settings"):
        train_judge.main([*argv, "--max_swaps", "2"])


def test_labels_need_both_kinds_of_swap():
    from diversed_hf.training.judge_labels import train_judge

    with pytest.raises(ValueError, match="needs both harmless and harmful swaps"):
        train_judge(JudgeHead(4), torch.randn(20, 4), torch.ones(20))


def test_bad_options_are_refused_by_name(capsys):
    import train_judge

    with pytest.raises(SystemExit):
        train_judge.parse_args(["--task", "testbed_arith", "--output_dir", "x", "--threshold", "-1"])
    assert "--threshold must be a number >= 0" in capsys.readouterr().err


def _arith_prompts(count: int):
    from diversed_hf.cli.evaluation import load_task_data
    from diversed_hf.lab.tasks import get_task

    data = load_task_data("testbed_arith", "train", count, 0)
    return list(data["prompt"]), list(data["reference"]), get_task("testbed_arith").reward


def test_batched_mining_gives_the_labels_of_one_prompt_at_a_time():
    from diversed_hf import testbed
    from diversed_hf.training.judge_labels import MiningSettings, _mine_shard

    target, draft, tokenizer = testbed.load_pair()
    prompts, references, reward = _arith_prompts(6)
    settings = MiningSettings(max_new_tokens=24, max_swaps=3)
    alone = [_mine_shard(target, draft, tokenizer, [p], [r], reward, settings, 1) for p, r in zip(prompts, references)]
    alone = [mined for mined in alone if mined is not None]
    features, labels = _mine_shard(target, draft, tokenizer, prompts, references, reward, settings, 4)
    assert len(labels) > 3
    assert torch.equal(labels, torch.cat([mined[1] for mined in alone]))
    torch.testing.assert_close(features, torch.cat([mined[0] for mined in alone]), atol=1e-4, rtol=1e-4)
    # the feature is the target's last hidden state after the swapped token, as a plain forward gives it
    from diversed_hf.training.judge_labels import _draft_guesses

    prompt = tokenizer(prompts[0], return_tensors="pt")["input_ids"][0]
    answer = target.generate(prompt[None], do_sample=False, max_new_tokens=24, pad_token_id=tokenizer.pad_token_id)[0]
    guesses = _draft_guesses(target, draft, answer, len(prompt))
    slot = int((guesses != answer[len(prompt) :]).nonzero()[0])
    swapped = torch.cat([answer[: len(prompt) + slot], guesses[slot : slot + 1]])[None]
    with torch.no_grad():
        state = target(swapped, output_hidden_states=True).hidden_states[-1][0, -1]
    torch.testing.assert_close(alone[0][0][0], state, atol=1e-5, rtol=1e-5)


def test_a_feature_draft_guesses_what_it_drafts_first_in_a_round():
    """A judge at threshold 0 keeps every draft: with one drafted token per round and greedy decoding the text
    alternates the draft's token (drafted on the text so far) and the target's. The mined guesses on that text are
    the drafted tokens at every drafted slot, so mining reads an EagleDraft as generate drafts with it."""
    from diversed_hf import EagleDraft, JudgeHead, enable_diversed, testbed
    from diversed_hf.training.judge_labels import _draft_guesses
    from diversed_hf.verifiers import JudgeVerifier

    target, _, tokenizer = testbed.load_pair()
    enable_diversed(target)
    torch.manual_seed(0)
    draft = EagleDraft.for_target(target).eval()
    keep_all = JudgeVerifier(JudgeHead.for_target(target), threshold=0.0)
    prompts, _, _ = _arith_prompts(2)
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = target.generate(
            ids, do_sample=False, max_new_tokens=12, pad_token_id=tokenizer.pad_token_id, eos_token_id=[],
            assistant_model=draft, num_assistant_tokens=1, verifier=keep_all, return_dict_in_generate=True,
        )  # fmt: skip
        assert out.speculation.total_accepted == 6
        text = out.sequences[0]
        guesses = _draft_guesses(target, draft, text, ids.shape[1])
        drafted = text[ids.shape[1] :: 2]  # rounds of (draft, target's token)
        assert torch.equal(guesses[::2], drafted)
        assert not torch.equal(guesses[1::2], text[ids.shape[1] + 1 :: 2])  # an untrained draft: the target differs
